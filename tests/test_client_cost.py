"""What one client costs the server, whatever the chunks' size: sixteen clients that read nothing,
each at another offset of a stream written before they came, hold a bounded amount of the
server's memory at every endpoint, on every server; a reader catching up is fetched about what
it is sent; a JSON array of a million values is refused whole while other appends go on. Real
servers, real sockets, the server's resident memory and its own metrics."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from django.db import connections

import pgstreams
from bench import catchup
from bench.fanout import METRICS_TOKEN
from demo_project.servers import SERVERS
from pgstreams.durable import wire
from pgstreams.models import Chunk
from tests.conftest import open_server
from tests.helpers import RawWebSocket, ServerMemory, response_head

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess, pytest.mark.slow]

CLIENTS = 16
# (chunk size, chunks): 64 KB is the largest chunk (MAX_CHUNK_BYTES); the stream is far larger
# than what every client may hold together.
SIZES = {"64KB": (65536, 600), "1KB": (1024, 12000)}
# What a client that reads nothing may hold of a server's memory, at most (the bound docs/howto/deploy.md states).
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
    writing = threading.Thread(target=_write, args=(stream, chunk_bytes, chunks))
    writing.start()  # while the server starts
    with open_server(server) as host:
        writing.join()
        # The server's first answers of each kind load what they need: then the baseline.
        warm = pgstreams.create_stream(path=f"cost/{server}/{endpoint}/{size}/warm")
        pgstreams.write_many(warm.id, ["x" * chunk_bytes] * 4)
        pgstreams.close(warm.id)
        _read_through(host, endpoint, warm)
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


def _write(stream: pgstreams.Stream, chunk_bytes: int, chunks: int) -> None:
    try:
        for at in range(0, chunks, 100):
            pgstreams.write_many(stream.id, [f"{at + i:08d}".ljust(chunk_bytes, "x") for i in range(100)])
    finally:
        connections.close_all()


def _read_through(host: str, endpoint: str, stream: pgstreams.Stream) -> None:
    """Read a closed stream from its start to its end, as a client of ``endpoint`` would."""
    if endpoint == "websocket":
        catchup.read_websocket(f"http://{host}", str(stream.id))
        return
    with httpx.Client(base_url=f"http://{host}", timeout=10) as client:
        client.get(ENDPOINTS[endpoint][1](stream, 0)).raise_for_status()


def _settled_peak(server: ServerMemory, quiet: float = 1.0, longest: float = 20.0) -> int:
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


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("transport", catchup.TRANSPORTS)
def test_a_reader_catching_up_is_fetched_at_most_twice_what_it_is_sent(transport: str, size: str) -> None:
    """One client reads a closed stream from its start, as a browser would (acking each frame;
    resuming each response that ends after its bytes); the server's listener fetches at most
    twice the data the client gets (it fetched 500 chunks whatever their size, and the
    WebSocket and SSE endpoints dropped what did not fit). The Durable Streams endpoint's
    catch-up reads are its own query's, which reads what the response holds."""
    chunk_bytes, chunks = SIZES[size]
    stream = pgstreams.create_stream()
    for at in range(0, chunks, 100):
        pgstreams.write_many(stream.id, [f"{at + i:08d}".ljust(chunk_bytes, "x") for i in range(100)])
    pgstreams.close(stream.id)
    with open_server("daphne", env={"DEMO_METRICS_TOKEN": METRICS_TOKEN}) as host:
        base = f"http://{host}"
        before = catchup.fetched(base)
        offsets = catchup.READERS[transport](base, str(stream.id))
        fetched = catchup.fetched(base) - before
    assert offsets == list(range(chunks))
    sent = chunks * chunk_bytes
    print(f"a {transport} reader catching up on {chunks} x {size}: {fetched / sent:.2f}x what it was sent fetched")
    assert fetched <= 2 * sent


def test_a_json_array_of_a_million_values_is_refused_whole_while_other_appends_go_on() -> None:
    """One POST of a 2.4 MB JSON array of 1.2 million values, while another client appends a
    line to another stream every 20 ms: the array was one appender item whatever APPEND_BATCH
    said (503 after 12 s, 169 MB of rows that did not commit, the other appends held up 5 s)."""
    pgstreams.create_stream(path="cost/array", content_type="application/json")
    pgstreams.create_stream(path="cost/lines")
    with open_server("daphne") as host, httpx.Client(base_url=f"http://{host}", timeout=60) as client:
        lines: list[tuple[int, float]] = []
        done = threading.Event()

        def append_lines() -> None:
            with httpx.Client(base_url=f"http://{host}", timeout=60) as other:
                for i in range(1000):  # bounded: until the array is answered
                    began = time.monotonic()
                    answer = other.post("/pgstreams/v1/stream/cost/lines", content=f"{i}\n", headers=TEXT)
                    lines.append((answer.status_code, time.monotonic() - began))
                    if done.wait(0.02):
                        return

        appender = threading.Thread(target=append_lines)
        appender.start()
        time.sleep(0.2)
        began = time.monotonic()
        body = "[" + ",".join(["1"] * 1_200_000) + "]"
        answer = client.post("/pgstreams/v1/stream/cost/array", content=body, headers=JSON)
        answered = time.monotonic() - began
        time.sleep(0.2)
        done.set()
        appender.join(60)
    print(
        f"a 2.4 MB JSON array: {answer.status_code} after {answered * 1000:.0f} ms; {len(lines)} appends to another "
        f"stream meanwhile, the slowest answered in {max(t for _, t in lines) * 1000:.0f} ms"
    )
    assert answer.status_code == 413, answer.text[:200]
    assert "1200000 values is over one append's 10000" in answer.text
    assert not Chunk.objects.filter(stream__path="cost/array").exists()
    assert lines and {status for status, _ in lines} == {204}
    assert Chunk.objects.filter(stream__path="cost/lines").count() == len(lines)


TEXT = {"Content-Type": "text/plain"}
JSON = {"Content-Type": "application/json"}
