"""The benchmark's WebSocket mode: the project's ASGI application in a daphne process, WebSocket
clients in other processes spread over the streams, the same writers as the other modes; it
measures chunks delivered per second, end-to-end latency, coverage and the server's peak memory.

Streams have no owner, so the clients need no session; the project's ALLOWED_HOSTS must accept
127.0.0.1 (the clients send it as Origin)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from . import procs
from .run import LATENCY_KEYS, Config, boot, cleanup, create_streams, drive, percentiles, spread, writer_processes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_port(port: int, server: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline or not server.is_alive():
                raise RuntimeError("the benchmark's daphne server did not start") from None
            time.sleep(0.1)


class PeakMemory(threading.Thread):
    """Samples the resident memory of a process and its children (a server's workers: granian
    runs the application in one) every 50 ms and keeps the highest sum."""

    def __init__(self, pid: int) -> None:
        super().__init__(name="pgstreams-bench-memory", daemon=True)
        self.process = psutil.Process(pid)
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                children = self.process.children(recursive=True)
                rss = self.process.memory_info().rss
            except psutil.Error:
                return
            for child in children:
                with contextlib.suppress(psutil.Error):  # a child may be gone already
                    rss += child.memory_info().rss
            self.peak = max(self.peak, rss)


def run_ws(config: Config, say: Callable[[str], None] = print) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    settings_for_children = boot("buffered")
    port = _free_port()
    streams = create_streams(config.writers * config.streams_per_writer)
    client_procs = min(config.clients, 4)
    assigned = [i % len(streams) for i in range(config.clients)]
    n_procs = min(config.writers, config.writer_processes or os.cpu_count() or 1)

    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    progress = ctx.Array("q", n_procs, lock=False)
    server = ctx.Process(target=procs.server, args=(settings_for_children, port), name="pgstreams-bench-daphne")
    clients = [
        ctx.Process(
            target=procs.ws_clients,
            args=(f"ws://127.0.0.1:{port}", streams, part, config.duration + config.drain + 30, ready, results),
            name=f"pgstreams-bench-ws-{c}",
        )
        for c, part in enumerate(spread(assigned, client_procs))
    ]
    writers = writer_processes(ctx, settings_for_children, config, streams, (go, ready, results, progress))
    say(f"ws: {config.clients} WebSocket clients of one daphne process, {config.writers} writers")
    memory = None
    try:
        server.start()
        _wait_for_port(port, server)
        memory = PeakMemory(server.pid)
        memory.start()
        collected = drive(clients + writers, config, ready, results, go, progress)
    finally:
        if memory is not None:
            memory.stop.set()
        server.terminate()
        server.join(10)
        if server.is_alive():
            server.kill()
        cleanup()

    commits: dict[str, Any] = {}
    for kind, result in collected:
        if kind == "writer":
            commits.update(result.commits)
    received = [r for kind, r in collected if kind == "ws"]
    e2e = [
        max(0.0, t - commits[streams[index]][offset])
        for r in received
        for index, offset, t in zip(r.stream, r.offset, r.received, strict=True)
    ]
    expected = sum(len(commits[streams[i]]) for i in assigned)
    times = [t for r in received for t in r.received]
    span = max(times) - min(times) if len(times) > 1 else 0.0
    return {
        "clients": config.clients,
        "client_processes": client_procs,
        "writers": config.writers,
        "written": sum(len(c) for c in commits.values()),
        "delivered_per_s": round(len(e2e) / span, 1) if span else 0.0,
        "e2e_ms": percentiles(e2e, LATENCY_KEYS),
        "coverage": round(len(e2e) / expected, 6) if expected else None,
        "duplicates": sum(r.duplicates for r in received),
        "out_of_order": sum(r.out_of_order for r in received),
        "server_peak_mib": round((memory.peak if memory else 0) / 2**20, 1),
        "errors": [e for r in received for e in r.errors][:10],
    }
