"""Helpers shared by the test modules (no fixtures: those are in conftest.py)."""

from __future__ import annotations

import base64
import contextlib
import os
import socket
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db import connection, connections


def delete_chunks(stream_id: Any, start: int, stop: int) -> None:
    """Delete chunks start..stop-1 of a stream, as pruning or a retention job would."""
    with connection.cursor() as cursor:
        cursor.execute(
            'DELETE FROM pgstreams_chunk WHERE stream_id = %s AND "offset" >= %s AND "offset" < %s',
            [stream_id, start, stop],
        )


@contextlib.contextmanager
def database_alias(alias: str, entry: dict[str, Any]) -> Iterator[str]:
    """``settings.DATABASES[alias] = entry`` for the length of the block, usable by Django (in
    this thread) and by pgstreams' own connections; closed and removed afterwards."""
    configured = connections.configure_settings({**settings.DATABASES, alias: entry})
    settings.DATABASES[alias] = connections.settings[alias] = configured[alias]
    # Connected now: a Django test case refuses to open connections to aliases it did not set up.
    connections[alias].connect()
    try:
        yield alias
    finally:
        connections[alias].close()
        del connections[alias]
        connections.settings.pop(alias, None)
        settings.DATABASES.pop(alias, None)


class RawWebSocket:
    """A client that speaks just enough WebSocket to open a socket and send text frames, and
    never reads what the server sends (after the handshake): the hostile client of the memory
    tests, whose unread data piles up on the server unless the server stops sending."""

    def __init__(self, host: str, path: str) -> None:
        address, port = host.rsplit(":", 1)
        self.sock = socket.create_connection((address, int(port)), timeout=10)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nOrigin: http://{host}\r\n\r\n".encode()
        )
        response = b""
        while b"\r\n\r\n" not in response and len(response) < 4096:
            response += self.sock.recv(1)  # the handshake only, byte by byte: nothing past it
        if not response.startswith(b"HTTP/1.1 101"):
            raise ConnectionError(f"no WebSocket: {response[:80]!r}")

    def send_text(self, text: str) -> None:
        payload = text.encode()
        assert len(payload) < 126
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + masked)

    def read_to_end(self, timeout: float = 10) -> bytes:
        """Everything the server sent after the handshake, up to its end of stream (or timeout)."""
        self.sock.settimeout(timeout)
        data = b""
        for _ in range(100_000):  # bounded: the server closes, or recv times out
            try:
                part = self.sock.recv(65536)
            except (TimeoutError, OSError):
                break
            if not part:
                break
            data += part
        return data

    def close(self) -> None:
        self.sock.close()
