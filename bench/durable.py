"""The benchmark's Durable Streams mode (``--durable``): the same load, from Node's fetch
(``node/durable_load.mjs``), on the protocol's Node reference server (``@durable-streams/server``,
file-backed) and on pgstreams' endpoint served by 1, 2... daphne processes of this project, and
by one process of each other server asked for (``--servers``: uvicorn, granian, the demo's
application as the fan-out benchmark serves it).

It measures appends/s and their latency over concurrent connections, one stream and one append
in flight each (a ladder: 64, 100, 1,000 connections), stream creation (PUT) per second,
catch-up reads in MB/s, the token-per-POST shape (``--paced-streams`` streams, each read over
SSE and appended to at each rate of ``--paced-rate`` in turn, open loop, until one is not held:
the most appends/s held with nothing failed or missed and 99% answered within a second), and
the time from an append to a long-poll and an SSE reader's receipt. Around each part it reads
the server's CPU time and, for pgstreams, how many write transactions Postgres began (the next
transaction id moves once per transaction that writes): appends per transaction, and CPU per
append, per create, per MB read and per live delivery. pgstreams commits each append to
Postgres with the server's ``synchronous_commit`` (``on``: flushed to its WAL); the reference
writes each append to a per-stream log file and fdatasyncs it, and keeps its metadata in LMDB.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
import psycopg
from django.conf import settings
from django.db import connections

from pgstreams import conf, db
from pgstreams.models import Stream

from . import procs
from .run import boot
from .ws import _free_port, _wait_for_port

NODE = Path(settings.BASE_DIR) / "node"
# A token-per-POST rate is held when 99% of its appends were answered within this many ms.
HELD_MS = 1000.0


@dataclass
class DurableConfig:
    seconds: float = 10.0
    connections: tuple[int, ...] = (64, 100, 1000)  # one part each
    paced_streams: int = 1000
    paced_rates: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0)  # appends/s to each, a ladder
    payload: int = 64
    read_megabytes: float = 20.0
    readers: int = 4
    latency_streams: int = 16
    interval: float = 200.0  # ms between two appends to a latency stream (80 appends/s in all: not a load test)
    processes: tuple[int, ...] = (1, 2)  # daphne processes serving pgstreams, one run each
    servers: tuple[str, ...] = ("daphne",)  # and one process of each other server, one run each


def run_durable(config: DurableConfig, say: Callable[[str], None] = print) -> dict[str, Any]:
    node = _node()
    runs: dict[str, Any] = {}
    prefix = f"pgstreams-bench-{uuid.uuid4().hex[:8]}"
    parts = [f"appends:{n}" for n in config.connections] + ["creates", "catch_up"]
    parts += ([f"paced:{rate:g}" for rate in config.paced_rates] if config.paced_streams else []) + ["long_poll", "sse"]
    say("durable: the reference server (file-backed)")
    runs["reference, file-backed"] = _parts(node, parts, _reference, config, f"{prefix}/reference")
    settle = min(0.5, config.seconds / 20)  # after daphne's start: 0.5 s for parts of 10 s or more
    try:
        for server in config.servers:
            for n in config.processes if server == "daphne" else (1,):
                name = f"pgstreams, {n} {server} process{'es' if n > 1 else ''}"
                say(f"durable: {name}")
                serve = (lambda n=n: _daphnes(n, settle)) if server == "daphne" else (lambda s=server: _served(s))
                runs[name] = _parts(node, parts, serve, config, f"{prefix}/{server}{n}")
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


def _parts(
    node: str,
    parts: list[str],
    serve: Callable[[], AbstractContextManager[tuple[list[str], list[int]]]],
    config: DurableConfig,
    prefix: str,
) -> dict[str, Any]:
    """Each part on a server started afresh (``serve()``: its base URLs and processes), so that
    a server one part brings down does not fail the parts after it: that part is reported as
    failed. The token-per-POST rates climb until one is not held (``_held``)."""
    merged: dict[str, Any] = {"appends": [], "paced": [], "server": {}, "failed": {}}
    for part in parts:
        if part.startswith("paced:") and merged["paced"] and not _held(merged["paced"][-1]):
            continue
        try:
            with serve() as (bases, pids):
                report = _load(node, bases, pids, config, f"{prefix}/{part.replace(':', '-')}", part)
        except RuntimeError as exc:
            merged["failed"][part] = str(exc)[-300:]
            if part.startswith("paced:"):  # a rate that brought the server down: not held
                merged["paced"].append({"rate": float(part.split(":")[1]), "brought_down": True})
            continue
        merged["appends"] += report.pop("appends", [])
        if "paced" in report:
            merged["paced"].append(report.pop("paced"))
        merged["server"].update(report.pop("server"))
        merged.update(report)
    return merged


def _held(paced: dict[str, Any]) -> bool:
    """Whether a token-per-POST rate was held: nothing failed, none missed by its readers, and
    the appends answered as they came (99% within ``HELD_MS``: a server falling behind answers
    later and later)."""
    if paced.get("brought_down"):
        return False
    p99 = paced["answered_ms"]["p99"]
    return not paced["failed"] and not paced["missed"] and p99 is not None and p99 <= HELD_MS


def _load(
    node: str, bases: list[str], pids: list[int], config: DurableConfig, prefix: str, part: str
) -> dict[str, Any]:
    """One part of the load on the server at ``bases`` (its processes ``pids``), with the
    server's CPU and write transactions during it."""
    options = {
        "bases": bases,
        "prefix": prefix,
        "connections": list(config.connections),
        "seconds": config.seconds,
        "payload": config.payload,
        "readMegabytes": config.read_megabytes,
        "readers": config.readers,
        "latencyStreams": config.latency_streams,
        "interval": config.interval,
        "pacedStreams": config.paced_streams,
        "part": part,
    }
    counters = _Counters(pids)
    errors = tempfile.TemporaryFile("w+")  # not a pipe: nobody reads it while the load runs
    command = [node, "durable_load.mjs", json.dumps(options)]
    load = subprocess.Popen(command, cwd=NODE, stdout=subprocess.PIPE, stderr=errors, text=True)
    server: dict[str, dict[str, float]] = {}
    last = ""
    try:
        assert load.stdout is not None
        for line in load.stdout:  # bounded by the load's own parts; the timeout below
            if line.startswith("mark "):
                _, part, phase = line.split()
                if phase == "start":
                    counters.start(part)
                else:
                    server[part] = counters.end(part)
            elif line.strip():
                last = line
        load.wait(600)
    finally:
        if load.poll() is None:
            load.kill()
        counters.close()
    if load.returncode != 0:
        errors.seek(0)
        raise RuntimeError(f"the load failed: {errors.read()[-2000:]}")
    errors.close()
    report = json.loads(last)
    report["server"] = server
    return report


class _Counters:
    """The server's CPU seconds and Postgres's write transactions, read around each part."""

    def __init__(self, pids: list[int]) -> None:
        self.processes = [psutil.Process(pid) for pid in pids]
        self.conn = psycopg.connect(**db.connect_kwargs(conf.database(), "bench counters"))  # autocommit
        self.began: dict[str, tuple[float, float, int]] = {}

    def _read(self) -> tuple[float, float, int]:
        cpu = 0.0
        for process in self.processes:
            for p in [process, *process.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    times = p.cpu_times()
                    cpu += times.user + times.system
        (xid,) = self.conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()
        return time.monotonic(), cpu, int(xid)

    def start(self, part: str) -> None:
        self.began[part] = self._read()

    def end(self, part: str) -> dict[str, float]:
        (t0, cpu0, xid0), (t1, cpu1, xid1) = self.began.pop(part), self._read()
        return {"seconds": t1 - t0, "cpu_seconds": cpu1 - cpu0, "write_transactions": xid1 - xid0}

    def close(self) -> None:
        self.conn.close()


@contextmanager
def _reference() -> Iterator[tuple[list[str], list[int]]]:
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
            yield [f"http://127.0.0.1:{port}"], [server.pid]
        finally:
            server.terminate()
            server.wait(10)


@contextmanager
def _daphnes(n: int, settle: float) -> Iterator[tuple[list[str], list[int]]]:
    """``n`` daphne processes of this project on their own ports, the endpoint open to anyone,
    ``settle`` seconds after the last has opened its port."""
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
        time.sleep(settle)
        pids = [server.pid for server in servers if server.pid is not None]
        yield [f"http://127.0.0.1:{port}/pgstreams" for port in ports], pids
    finally:
        for server in servers:
            server.terminate()
            server.join(10)
            if server.is_alive():
                server.kill()


@contextmanager
def _served(server: str) -> Iterator[tuple[list[str], list[int]]]:
    """One process of ``server`` (uvicorn, granian) serving the demo's application, the
    endpoint open to anyone; its processes are the server's and its workers."""
    from .fanout import serving  # which imports this module

    with serving(server, "demo_project.asgi:application") as (base, process):
        yield [f"{base}/pgstreams"], [process.pid, *(child.pid for child in process.children(recursive=True))]


class _Alive:
    """A subprocess as ``_wait_for_port`` asks about it."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process

    def is_alive(self) -> bool:
        return self.process.poll() is None


def table(report: dict[str, Any]) -> str:
    """The runs side by side, as a Markdown table."""
    names = list(report["runs"])
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = []
    for n in report["config"]["connections"]:
        rows += [
            (
                f"{n} connections, 64 B appends: appends/s (failed)",
                lambda r, n=n: f"{_appends(r, n)['appends_per_second']:,.0f} ({_appends(r, n)['failed']})",
            ),
            (f"{n} connections: append p50 / p99 ms", lambda r, n=n: _ms(_appends(r, n)["latency_ms"])),
            (
                f"{n} connections: appends per write transaction, server CPU per append",
                lambda r, n=n: _per_append(r, f"appends-{n}", _appends(r, n)["appends"]),
            ),
        ]
    rows += [
        ("creates (PUT)/s", lambda r: f"{r['creates']['creates_per_second']:,.0f} ({r['creates']['failed']} failed)"),
        ("creates: server CPU per create", lambda r: _cpu_per(r, "creates", r["creates"]["creates"])),
        ("catch-up reads, MB/s", lambda r: f"{r['catch_up']['megabytes_per_second']:,.1f}"),
        (
            "catch-up: server CPU per MB",
            lambda r: _cpu_per(r, "catch-up", r["catch_up"]["whole_reads"] * r["catch_up"]["stream_megabytes"]),
        ),
    ]
    if report["config"]["paced_streams"]:
        n = report["config"]["paced_streams"]
        rows += [
            (f"token per POST, {n} streams: the most appends/s held (appends/s to each)", _most_held),
            ("token per POST at that rate: answered p50 / p99 ms", lambda r: _ms(_best(r)["answered_ms"])),
            ("token per POST at that rate: delivered over SSE p50 / p99 ms", lambda r: _ms(_best(r)["delivered_ms"])),
            (
                "token per POST at that rate: appends per write transaction, server CPU per append",
                _best_per_append,
            ),
            ("token per POST, the next rate: appends/s of offered (failed, missed), answered p99", _not_held),
        ]
    for live in ("long_poll", "sse"):
        label = "long-poll" if live == "long_poll" else "SSE"
        rows.append((f"{label}: append sent to reader, p50 / p99 ms", lambda r, k=live: _ms(r[k]["from_request_ms"])))
        rows.append(
            (f"{label}: append answered to reader, p50 / p99 ms", lambda r, k=live: _ms(r[k]["from_response_ms"]))
        )
        rows.append((f"{label}: deliveries (missed)", lambda r, k=live: f"{r[k]['deliveries']} ({r[k]['missed']})"))
        rows.append(
            (
                f"{label}: server CPU per append and its delivery",
                lambda r, k=live: _cpu_per(r, k.replace("_", "-"), r[k]["deliveries"]),
            )
        )
    lines = ["| | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    lines += [
        f"| {label} | " + " | ".join(_cell(cell, report["runs"][name]) for name in names) + " |" for label, cell in rows
    ]
    return "\n".join(lines)


def _best(run: dict[str, Any]) -> dict[str, Any]:
    """The highest token-per-POST rate ``run`` held (KeyError if none)."""
    held = [paced for paced in run["paced"] if _held(paced)]
    if not held:
        raise KeyError("paced")
    return held[-1]


def _best_per_append(run: dict[str, Any]) -> str:
    best = _best(run)
    part = f"paced-{best['rate']:g}"
    return _per_append(run, part, best["appends_per_second"] * run["server"][part]["seconds"])


def _most_held(run: dict[str, Any]) -> str:
    try:
        best = _best(run)
    except KeyError:
        return "none"
    return f"{best['appends_per_second']:,.0f} ({best['rate']:g}/s)"


def _not_held(run: dict[str, Any]) -> str:
    if not run["paced"] or _held(run["paced"][-1]):
        return "- (every rate held)"
    paced = run["paced"][-1]
    if paced.get("brought_down"):
        return f"{paced['rate']:g}/s each: the server went down"
    return (
        f"{paced['appends_per_second']:,.0f} of {paced['offered_per_second']:,.0f} "
        f"({paced['failed']}, {paced['missed']}), answered p99 {paced['answered_ms']['p99']:.1f} ms"
    )


def _appends(run: dict[str, Any], connections: int) -> dict[str, Any]:
    """The appends part of ``run`` with ``connections`` connections (KeyError if it failed)."""
    for part in run["appends"]:
        if part["connections"] == connections:
            return part
    raise KeyError(connections)


def _cell(cell: Callable[[dict[str, Any]], str], run: dict[str, Any]) -> str:
    """A figure of ``run``, or "failed" for a part that did not complete (``run["failed"]``)."""
    try:
        return cell(run)
    except (KeyError, IndexError):
        return "failed"


def _ms(figures: dict[str, float | None]) -> str:
    if figures["p50"] is None:
        return "-"
    return f"{figures['p50']:.1f} / {figures['p99']:.1f}"


def _cpu_per(run: dict[str, Any], part: str, count: float) -> str:
    """The server's CPU in ``part`` per one of ``count`` (requests, megabytes, deliveries)."""
    counted = run["server"].get(part)
    if not counted or not count:
        return "-"
    return f"{counted['cpu_seconds'] / count * 1e6:,.0f} us"


def _per_append(run: dict[str, Any], part: str, appends: float) -> str:
    """Appends per write transaction (none for a server without Postgres) and CPU per append."""
    counted = run["server"].get(part)
    if not counted or not appends:
        return "-"
    per_transaction = appends / counted["write_transactions"] if counted["write_transactions"] > 10 else None
    cpu = _cpu_per(run, part, appends)
    return f"{per_transaction:,.1f}, {cpu}" if per_transaction is not None else f"-, {cpu}"
