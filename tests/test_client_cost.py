"""What one client costs the server, whatever the chunks' size: sixteen clients that read nothing,
each at another offset of a stream written before they came, hold a bounded amount of the
server's memory at every endpoint, on every server; a reader catching up is read for about what
it is sent. Real servers, real sockets, the server's resident memory and its own metrics."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import Callable

import httpx
import pytest

import pgstreams
from bench.servers import SERVERS
from pgstreams.durable import wire
from tests.conftest import open_server
from tests.helpers import RawWebSocket, ServerMemory, response_head
from tests.test_servers import follow

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess, pytest.mark.slow]

CLIENTS = 16
# (chunk size, chunks): 64 KB is the largest chunk (MAX_CHUNK_BYTES); the stream is far larger
# than what every client may hold together.
SIZES = {"64KB": (65536, 600), "1KB": (1024, 12000)}
# What a client that reads nothing may hold of a server's memory, at most (the README's bound).
CLIENT_BYTES = 4 << 20


def _silent_http(host: str, target: str) -> socket.socket:
    """A GET whose answer's head is read and its body never: a 4 KiB receive buffer."""
    address, port = host.rsplit(":", 1)
    sock = socket.create_connection((address, int(port)), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    head = response_head(sock)
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    return sock


def _silent_websocket(host: str, target: str) -> socket.socket:
    return RawWebSocket(host, target).sock  # never acks: the server sends one window


# Each endpoint: the target of a client reading the stream (its id, its path) from an offset.
ENDPOINTS: dict[str, tuple[Callable[[str, str], socket.socket], Callable[[pgstreams.Stream, int], str]]] = {
    "websocket": (_silent_websocket, lambda s, at: f"/ws/pgstreams/{s.id}/?from={at}"),
    "sse": (_silent_http, lambda s, at: f"/pgstreams/streams/{s.id}/events?from={at}"),
    "durable-catch-up": (_silent_http, lambda s, at: f"/pgstreams/v1/stream/{s.path}?offset={wire.format_offset(at)}"),
    "durable-long-poll": (
        _silent_http,
        lambda s, at: f"/pgstreams/v1/stream/{s.path}?offset={wire.format_offset(at)}&live=long-poll",
    ),
    "durable-sse": (
        _silent_http,
        lambda s, at: f"/pgstreams/v1/stream/{s.path}?offset={wire.format_offset(at)}&live=sse",
    ),
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("server", SERVERS)
def test_sixteen_clients_that_read_nothing_each_hold_a_bounded_part_of_the_server(
    server: str, endpoint: str, size: str
) -> None:
    chunk_bytes, chunks = SIZES[size]
    open_client, target = ENDPOINTS[endpoint]
    stream = pgstreams.create_stream(path=f"cost/{server}/{endpoint}/{size}")
    for at in range(0, chunks, 100):
        pgstreams.write_many(stream.id, [f"{at + i:08d}".ljust(chunk_bytes, "x") for i in range(100)])
    with open_server(server) as host:
        # The server's first answers of each kind load what they need: then the baseline.
        warm = pgstreams.create_stream(path=f"cost/{server}/{endpoint}/{size}/warm")
        pgstreams.write_many(warm.id, ["x" * chunk_bytes] * 4)
        pgstreams.close(warm.id)
        _read_through(host, endpoint, target(warm, 0))
        server_memory = ServerMemory(host)
        before = server_memory.rss()
        step = chunks // CLIENTS
        clients = [open_client(host, target(stream, i * step)) for i in range(CLIENTS)]
        peak = _settled_peak(server_memory)
        for client in clients:
            client.close()
    growth = peak - before
    print(
        f"{CLIENTS} {endpoint} clients reading nothing of {chunks} x {size} on {server}: the server grew "
        f"{growth / 2**20:.1f} MiB, {growth / CLIENTS / 2**20:.2f} MiB a client"
    )
    assert growth < CLIENTS * CLIENT_BYTES


def _read_through(host: str, endpoint: str, target: str) -> None:
    """Read ``target`` of a closed stream to its end, as a client of ``endpoint`` would."""
    if endpoint == "websocket":
        items, last, _ = asyncio.run(follow(host, target))
        assert last["type"] == "end", last
        return
    with httpx.Client(base_url=f"http://{host}", timeout=10) as client:
        client.get(target).raise_for_status()


def _settled_peak(server: ServerMemory, quiet: float = 1.5, longest: float = 20.0) -> int:
    """The server's peak memory once it has stopped growing for ``quiet`` seconds."""
    peak = server.rss()
    grown_at = began = time.monotonic()
    while time.monotonic() - grown_at < quiet and time.monotonic() - began < longest:  # bounded
        time.sleep(0.05)
        now = server.rss()
        if now > peak + (256 << 10):
            grown_at = time.monotonic()
        peak = max(peak, now)
    return peak


TOKEN = "catch-up-test-metrics-token"


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("endpoint", ["websocket", "sse"])
def test_a_reader_catching_up_is_read_for_at_most_twice_what_it_is_sent(endpoint: str, size: str) -> None:
    """One client reads a closed stream from its start, as a browser would (acking each frame;
    resuming each response that ends after its bytes); the server's listener fetches at most
    twice the data the client gets (it fetched 500 chunks whatever their size, and the
    WebSocket and SSE endpoints dropped what did not fit). The Durable Streams endpoint's
    catch-up reads are its own query's, which reads what the response holds."""
    chunk_bytes, chunks = SIZES[size]
    stream = pgstreams.create_stream(path=f"catch-up/{endpoint}/{size}")
    for at in range(0, chunks, 100):
        pgstreams.write_many(stream.id, [f"{at + i:08d}".ljust(chunk_bytes, "x") for i in range(100)])
    pgstreams.close(stream.id)
    with open_server("daphne", env={"DEMO_METRICS_TOKEN": TOKEN}) as host:
        before = _fetched(host)
        offsets = READERS[endpoint](host, stream)
        fetched = _fetched(host) - before
    assert offsets == list(range(chunks))
    sent = chunks * chunk_bytes
    print(
        f"a {endpoint} reader catching up on {chunks} x {size}: "
        f"sent {sent / 2**20:.1f} MiB, fetched {fetched / sent:.2f}x that"
    )
    assert fetched <= 2 * sent


def _fetched(host: str) -> int:
    """The chunk data the server's listener has fetched, from its metrics."""
    answer = httpx.get(f"http://{host}/pgstreams/metrics/", headers={"Authorization": f"Bearer {TOKEN}"})
    answer.raise_for_status()
    found = re.search(r"^pgstreams_chunk_data_fetched_total (\S+)$", answer.text, re.M)
    assert found, answer.text[:500]
    return int(float(found[1]))


def _websocket_offsets(host: str, stream: pgstreams.Stream) -> list[int]:
    items, last, _ = asyncio.run(follow(host, f"/ws/pgstreams/{stream.id}/?from=0"))
    assert last["type"] == "end", last
    return [offset for offset, _ in items]


def _sse_offsets(host: str, stream: pgstreams.Stream) -> list[int]:
    """EventSource's way: each response that ends without ``end`` is resumed from Last-Event-ID."""
    offsets: list[int] = []
    with httpx.Client(base_url=f"http://{host}", timeout=10) as client:
        for _ in range(1000):  # bounded: a response carries at least one chunk
            headers = {"Last-Event-ID": str(offsets[-1])} if offsets else {}
            with client.stream("GET", f"/pgstreams/streams/{stream.id}/events", headers=headers) as answer:
                event = None
                for line in answer.iter_lines():
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("id: "):
                        offsets.append(int(line[4:]))
            if event == "end":
                return offsets
    raise AssertionError("the stream did not end")


READERS: dict[str, Callable[[str, pgstreams.Stream], list[int]]] = {
    "websocket": _websocket_offsets,
    "sse": _sse_offsets,
}
