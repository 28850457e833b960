"""The benchmark's Durable Streams mode (``--durable``): the same load, from Node's fetch
(``node/durable_load.mjs``), on the protocol's Node reference server (``@durable-streams/server``,
file-backed) and on pgstreams' endpoint served by 1, 2... daphne processes of this project.

It measures appends/s over concurrent connections (one stream each), catch-up reads in MB/s, and
the time from an append to a long-poll and an SSE reader's receipt. pgstreams commits each append
to Postgres with the server's ``synchronous_commit`` (``on``: flushed to its WAL); the reference
writes each append to a per-stream log file and fdatasyncs it, and keeps its metadata in LMDB.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connections

from pgstreams import conf
from pgstreams.models import Stream

from . import procs
from .run import boot
from .ws import _free_port, _wait_for_port

NODE = Path(settings.BASE_DIR) / "node"


@dataclass
class DurableConfig:
    seconds: float = 10.0
    connections: int = 64
    payload: int = 64
    read_megabytes: float = 20.0
    readers: int = 4
    latency_streams: int = 16
    interval: float = 200.0  # ms between two appends to a latency stream (80 appends/s in all: not a load test)
    processes: tuple[int, ...] = (1, 2)  # daphne processes serving pgstreams, one run each


def run_durable(config: DurableConfig, say: Callable[[str], None] = print) -> dict[str, Any]:
    node = _node()
    runs: dict[str, Any] = {}
    prefix = f"pgstreams-bench-{uuid.uuid4().hex[:8]}"
    with _reference() as base:
        say("durable: the reference server (file-backed)")
        runs["reference, file-backed"] = _load(node, [base], config, f"{prefix}/reference")
    try:
        for n in config.processes:
            say(f"durable: pgstreams, {n} daphne process(es)")
            with _daphnes(n) as bases:
                name = f"pgstreams, {n} daphne process{'es' if n > 1 else ''}"
                runs[name] = _load(node, bases, config, f"{prefix}/{n}")
    finally:
        Stream.objects.using(conf.database()).filter(path__startswith=prefix).delete()
    with connections[conf.database()].cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        level = cursor.fetchone()[0]
        cursor.execute("SHOW fsync")
        fsync = cursor.fetchone()[0]
    return {"config": asdict(config), "postgres": {"synchronous_commit": level, "fsync": fsync}, "runs": runs}


def _node() -> str:
    node = shutil.which("node")
    if node is None or shutil.which("npm") is None:
        raise RuntimeError("--durable needs node and npm (the load and the reference server run on node)")
    if not (NODE / "node_modules" / "@durable-streams" / "server").is_dir():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE, check=True, timeout=600)
    return node


def _load(node: str, bases: list[str], config: DurableConfig, prefix: str) -> dict[str, Any]:
    options = {
        "bases": bases,
        "prefix": prefix,
        "connections": config.connections,
        "seconds": config.seconds,
        "payload": config.payload,
        "readMegabytes": config.read_megabytes,
        "readers": config.readers,
        "latencyStreams": config.latency_streams,
        "interval": config.interval,
    }
    run = subprocess.run(
        [node, "durable_load.mjs", json.dumps(options)], cwd=NODE, capture_output=True, text=True, timeout=600
    )
    if run.returncode != 0:
        raise RuntimeError(f"the load failed: {run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


@contextmanager
def _reference() -> Iterator[str]:
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="pgstreams-bench-reference-") as data:
        server = subprocess.Popen(
            ["node", "reference_server.mjs", str(port), data],
            cwd=NODE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_for_port(port, _Alive(server))
            yield f"http://127.0.0.1:{port}"
        finally:
            server.terminate()
            server.wait(10)


@contextmanager
def _daphnes(n: int) -> Iterator[list[str]]:
    """``n`` daphne processes of this project on their own ports, the endpoint open to anyone."""
    ctx = multiprocessing.get_context("spawn")
    settings_for_children = boot("buffered")
    settings_for_children.pgstreams = {
        **settings_for_children.pgstreams,
        "DURABLE_AUTHORIZE": "demo_project.chat.durable.allow_everything",
    }
    ports = [_free_port() for _ in range(n)]
    servers = [
        ctx.Process(target=procs.server, args=(settings_for_children, port), name=f"pgstreams-bench-daphne-{i}")
        for i, port in enumerate(ports)
    ]
    try:
        for server, port in zip(servers, ports, strict=True):
            server.start()
            _wait_for_port(port, server)
        time.sleep(0.5)
        yield [f"http://127.0.0.1:{port}/pgstreams" for port in ports]
    finally:
        for server in servers:
            server.terminate()
            server.join(10)
            if server.is_alive():
                server.kill()


class _Alive:
    """A subprocess as ``_wait_for_port`` asks about it."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process

    def is_alive(self) -> bool:
        return self.process.poll() is None


def table(report: dict[str, Any]) -> str:
    """The runs side by side, as a Markdown table."""
    names = list(report["runs"])
    rows = [
        ("appends/s (64 B, one stream per connection)", lambda r: f"{r['appends']['appends_per_second']:,.0f}"),
        ("catch-up reads, MB/s", lambda r: f"{r['catch_up']['megabytes_per_second']:,.1f}"),
    ]
    for live in ("long_poll", "sse"):
        label = "long-poll" if live == "long_poll" else "SSE"
        rows.append(
            (
                f"{label}: append sent to reader, p50 / p99 ms",
                lambda r, k=live: f"{r[k]['from_request_ms']['p50']:.1f} / {r[k]['from_request_ms']['p99']:.1f}",
            )
        )
        rows.append(
            (
                f"{label}: append answered to reader, p50 / p99 ms",
                lambda r, k=live: f"{r[k]['from_response_ms']['p50']:.1f} / {r[k]['from_response_ms']['p99']:.1f}",
            )
        )
        rows.append((f"{label}: deliveries (missed)", lambda r, k=live: f"{r[k]['deliveries']} ({r[k]['missed']})"))
    lines = ["| | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    lines += [f"| {label} | " + " | ".join(cell(report["runs"][n]) for n in names) + " |" for label, cell in rows]
    return "\n".join(lines)
