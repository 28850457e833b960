"""The benchmark's fan-out mode (``--fanout``): shapes of S streams x N subscribers x R chunks/s,
delivered by one server process of the demo project (daphne, uvicorn or granian) over WebSocket,
pgstreams' SSE, Durable Streams SSE or long-poll, or the AI SDK's WebSocket chat transport (a
resume frame per socket, a frame per chunk, ``chat_asgi``), to subscribers in Node processes
(``node/fanout_load.mjs``), from a writer in another process (``stream_writer``, each chunk's data
its wall-clock time), which starts once every subscriber has connected and the server follows
each (its metrics say so: a WebSocket is accepted before its authorization lookup). Per shape:
how long the subscribers took to connect (the connect storm) and how much longer until the server
followed them all, deliveries/s, e2e p50/p99/max, coverage,
duplicates and gaps, the server's CPU per delivery and peak RSS, the subscribers' own CPU, where
a delivery's CPU goes (the writer process, Postgres, the server, and their sum); and the
ceiling in the same run: the raw ASGI application of ``raw_asgi`` on the same server, sending
the same subscribers the same bytes at the same rate, pgstreams reported as a fraction of it;
with ``--ceiling-writer`` the shape's writer writes beside the raw app too, to streams nobody reads,
so that the raw app shares the machine with the writer and Postgres as pgstreams does: what a
server sending each chunk in a frame of its own could deliver here.
``--idle`` measures what idle WebSockets and SSE connections cost the server, and the raw app,
from IDLE_SETTLE after the server follows them all (their first reads, and the collector's work
on the connect storm's garbage, take a few seconds more).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import select
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from demo_project.servers import server_command

from . import cpu, procs
from .durable import NODE, _node
from .report import Column, _grid, _opt
from .run import boot
from .ws import PeakMemory, _free_port, _wait_for_port

ROOT = Path(__file__).resolve().parent.parent
TRANSPORTS = ("ws", "sse", "ds-sse", "ds-lp", "aisdk-ws")
# The application a transport's pgstreams run serves: the demo's, or (ai 7's WebSocket chat
# transport, its resumes by stream id) the demo's with the benchmark's chat socket.
APPS = {"aisdk-ws": "bench.chat_asgi:application"}
SUBSCRIBERS_PER_NODE = 1000  # subscribers one Node process takes at most
CONNECT_TIMEOUT = 120.0  # seconds the subscribers have to connect, all of them
SETTLE = 0.5  # seconds between the last subscriber's connecting and the first write
DRAIN = 3.0  # seconds the subscribers stay after the last write at most (they leave once they have the last)
STREAMS_LABEL = "pgstreams-bench-fanout"  # the streams of a run, deleted after it
WRITER_READY_TIMEOUT = 60.0  # seconds the writer's process has to boot
IDLE_SETTLE = 5.0  # seconds between the server's following every idle subscriber and its idle CPU's measure
METRICS_TOKEN = uuid.uuid4().hex  # the demo's servers show their metrics to its bearer
# The gauge of the subscribers a demo server follows, by transport: a WebSocket is accepted before
# its authorization lookup, and a chat socket before its resume frame is read and looked up, so a
# client that has connected may not be followed yet.
FOLLOWED = {"ws": "pgstreams_websocket_clients", "sse": "pgstreams_sse_clients", "aisdk-ws": "pgstreams_chat_requests"}


@dataclass
class Shape:
    streams: int
    subscribers: int
    rate: float  # chunks per second per stream

    @classmethod
    def parse(cls, text: str) -> Shape:
        streams, subscribers, rate = text.lower().split("x")
        return cls(int(streams), int(subscribers), float(rate))

    def __str__(self) -> str:
        return f"{self.streams}x{self.subscribers}x{self.rate:g}"


@dataclass
class FanoutConfig:
    shapes: tuple[Shape, ...]
    transports: tuple[str, ...] = ("ws",)
    servers: tuple[str, ...] = ("daphne",)
    seconds: float = 10.0
    ceiling: bool = True
    ceiling_writer: bool = False  # the raw app's runs with the shape's writer beside them
    idle: int = 0  # idle connections of each kind, on idle // 10 streams (0: no idle part)


@contextmanager
def serving(server: str, app: str) -> Iterator[tuple[str, psutil.Process]]:
    """One process of ``server`` serving ``app``; yields its base URL and its process."""
    port = _free_port()
    env = {**os.environ, "DEMO_OPEN_DURABLE_STREAMS": "1", "DEMO_METRICS_TOKEN": METRICS_TOKEN}
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(server_command(server, app, port), cwd=ROOT, env=env, stdout=log, stderr=log)

        class Alive:
            def is_alive(self) -> bool:
                return proc.poll() is None

        try:
            try:
                _wait_for_port(port, Alive())
            except RuntimeError:
                log.seek(0)
                raise RuntimeError(f"{server} did not start: {log.read()[-2000:].decode(errors='replace')}") from None
            yield f"http://127.0.0.1:{port}", psutil.Process(proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _rss(process: psutil.Process) -> int:
    """Resident memory of a process and its children (a server's workers)."""
    return sum(p.memory_info().rss for p in [process, *process.children(recursive=True)])


def _subscribers(
    node: str,
    base: str,
    transport: str,
    streams: list[dict[str, str]],
    shape: Shape,
    seconds: float,
    idle: bool,
    chunks: int = 0,
) -> list[subprocess.Popen[str]]:
    """Node processes following ``streams``, ``shape.subscribers`` each, split so that none has
    more than SUBSCRIBERS_PER_NODE, for ``seconds``; given ``chunks`` (per stream, for streams
    that never end), each subscriber leaves sooner once it has the last."""
    per_stream = max(1, SUBSCRIBERS_PER_NODE // max(1, shape.subscribers))
    groups: list[tuple[list[dict[str, str]], int]] = []
    if shape.subscribers > SUBSCRIBERS_PER_NODE:
        parts = -(-shape.subscribers // SUBSCRIBERS_PER_NODE)
        groups = [(streams, shape.subscribers // parts)] * parts
    else:
        groups = [(streams[i : i + per_stream], shape.subscribers) for i in range(0, len(streams), per_stream)]
    options = {"base": base, "transport": transport, "seconds": seconds, "idle": idle, "chunks": chunks}
    return [
        subprocess.Popen(
            [node, "fanout_load.mjs", json.dumps({**options, "streams": part, "subscribers": n})],
            cwd=NODE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for part, n in groups
    ]


def _connected(clients: list[subprocess.Popen[str]]) -> float:
    """Wait until every subscriber has connected (or failed to): each Node process says "ready"
    on stderr; the seconds that took (the connect storm, reported apart from delivery)."""
    began = time.monotonic()
    pending = {client.stderr: client for client in clients if client.stderr is not None}
    while pending:  # bounded by CONNECT_TIMEOUT
        left = CONNECT_TIMEOUT - (time.monotonic() - began)
        readable, _, _ = select.select(list(pending), [], [], max(0.0, left))
        if not readable:
            raise RuntimeError(f"the subscribers did not connect within {CONNECT_TIMEOUT:.0f} s")
        for pipe in readable:
            line = pipe.readline()
            if not line:
                raise RuntimeError(f"a subscriber process ended before connecting ({pending[pipe].poll()})")
            if line == "ready\n":
                del pending[pipe]
    return time.monotonic() - began


def _followed(base: str, transport: str, count: int) -> float:
    """Wait until the demo server at ``base`` follows ``count`` subscribers of ``transport``
    (by its metrics; at once for transports whose answer comes only once the server follows);
    the seconds that took."""
    gauge = FOLLOWED.get(transport)
    began = time.monotonic()
    while gauge is not None:  # bounded by CONNECT_TIMEOUT
        answer = httpx.get(f"{base}/pgstreams/metrics/", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
        samples = [s for family in text_string_to_metric_families(answer.text) for s in family.samples]
        if sum(s.value for s in samples if s.name == gauge) >= count:
            break
        if time.monotonic() - began > CONNECT_TIMEOUT:
            raise RuntimeError(f"the server did not follow its {count} subscribers within {CONNECT_TIMEOUT:.0f} s")
        time.sleep(0.1)
    return time.monotonic() - began


def _collect(clients: list[subprocess.Popen[str]], timeout: float) -> list[dict[str, Any]]:
    results = []
    for client in clients:
        out, _ = client.communicate(timeout=timeout)
        results.append(json.loads(out))
    return results


def _latencies(results: list[dict[str, Any]]) -> dict[str, float | None]:
    """p50, p99 and max in ms from the subscribers' histograms of 0.1 ms buckets."""
    counts: dict[int, int] = {}
    for result in results:
        for bucket, n in result["histogram"].items():
            counts[int(bucket)] = counts.get(int(bucket), 0) + n
    total = sum(counts.values())
    if not total:
        return {"p50": None, "p99": None, "max": None}
    out: dict[str, float | None] = {}
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        rank, seen = q * total, 0
        for bucket in sorted(counts):
            seen += counts[bucket]
            if seen >= rank:
                out[name] = bucket / 10
                break
    out["max"] = max(counts) / 10
    return out


class _Writer:
    """The shape's writer (``procs.clock_writer``) in its own process, on streams of its own
    (``streams``): it writes once ``start()`` is called, and ``result()`` is what it reported."""

    def __init__(self, shape: Shape, seconds: float) -> None:
        self.streams = _make_streams(shape.streams)
        self.seconds = seconds
        ctx = multiprocessing.get_context("spawn")
        self._ready, self._go, self._results = ctx.Event(), ctx.Event(), ctx.Queue()
        ids = [s["id"] for s in self.streams]
        self.process = ctx.Process(
            target=procs.clock_writer,
            args=(boot("buffered"), ids, shape.rate, seconds, self._ready, self._go, self._results),
        )
        self.reported = False  # result() read what it reported

    def start(self) -> None:
        """Let it write, once its process is set up (a spawned process boots Django first)."""
        deadline = time.monotonic() + WRITER_READY_TIMEOUT
        while not self._ready.wait(0.5):
            if not self.process.is_alive():
                raise RuntimeError(f"the writer's process ended ({self.process.exitcode}) as it started")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the writer's process was not ready after {WRITER_READY_TIMEOUT:g} s")
        self._go.set()

    def result(self) -> procs.ClockWriterResult:
        deadline = time.monotonic() + self.seconds + 120
        while True:
            alive = self.process.is_alive()  # asked first: what it put before it ended, this get reads
            try:
                written = self._results.get(timeout=1.0)
                self.reported = True
                return written
            except queue.Empty:
                if not alive:
                    raise RuntimeError(f"the writer's process ended ({self.process.exitcode}) with no report") from None
                if time.monotonic() > deadline:
                    raise RuntimeError("the writer's process did not report in time") from None


@contextmanager
def _writing(shape: Shape, seconds: float) -> Iterator[_Writer]:
    """A ``_Writer``'s process running; after, it is stopped (let end once it has reported, else
    killed at once: a run that failed before reading its report may leave it writing, or held by
    the report it cannot hand over), and its streams are deleted."""
    writer: _Writer | None = None
    try:
        writer = _Writer(shape, seconds)
        writer.process.start()
        yield writer
    finally:
        if writer is not None and writer.process.pid is not None:
            if writer.reported:
                writer.process.join(30)
            writer.process.kill()  # if it is still there
            writer.process.join()
        _delete_streams()


def _make_streams(count: int) -> list[dict[str, str]]:
    """``count`` new JSON streams for a run, as its clients name them (id and path)."""
    from pgstreams import conf
    from pgstreams.models import Stream

    tag = uuid.uuid4().hex[:8]
    made = Stream.objects.using(conf.database()).bulk_create(
        Stream(label=STREAMS_LABEL, path=f"fanout/{tag}/{i}", content_type="application/json") for i in range(count)
    )
    return [{"id": str(s.id), "path": s.path} for s in made]


def _delete_streams() -> None:
    from pgstreams import conf
    from pgstreams.models import Stream

    Stream.objects.using(conf.database()).filter(label=STREAMS_LABEL).delete()


def _pgstreams_run(node: str, server: str, transport: str, shape: Shape, seconds: float) -> dict[str, Any]:
    app = APPS.get(transport, "demo_project.asgi:application")
    with serving(server, app) as (base, process), _writing(shape, seconds) as writer:
        clients = _subscribers(node, base, transport, writer.streams, shape, SETTLE + seconds + DRAIN, idle=False)
        connect = _connected(clients)
        followed = _followed(base, transport, shape.streams * shape.subscribers)
        time.sleep(SETTLE)
        memory = PeakMemory(process.pid)
        memory.start()
        postmaster = cpu.postmaster()
        server_cpu, postgres_cpu = cpu.tree(process), cpu.postgres(postmaster)
        writer.start()
        written = writer.result()
        out = _collect(clients, timeout=SETTLE + seconds + DRAIN + 60)
        server_cpu, postgres_cpu = cpu.tree(process) - server_cpu, cpu.postgres(postmaster) - postgres_cpu
        memory.stop.set()
    expected = sum(written.chunks.values()) * shape.subscribers
    parts = {"writer": written.cpu_seconds, "postgres": postgres_cpu, "server": server_cpu}
    return {
        **_figures(out, server_cpu, memory.peak, seconds, expected, connect),
        **cpu.per_delivery(parts, _delivered(out)),
        "appender_cpu_us_per_delivery": cpu.us_per(written.appender_cpu_seconds, _delivered(out), 2),
        "append_batches": written.batches,
        "followed_s": round(followed, 2),
    }


def _ceiling_run(
    node: str, server: str, transport: str, shape: Shape, seconds: float, with_writer: bool = False
) -> dict[str, Any]:
    """The raw app's run; ``with_writer``: with the shape's writer writing beside it, to streams
    nobody reads, so that the machine carries the writer's and Postgres' load as in pgstreams' run
    (``writer_chunks``: what it wrote, None without it)."""
    streams = [{"id": str(uuid.uuid4()), "path": f"raw/{i}"} for i in range(shape.streams)]
    chunks = int(shape.rate * seconds)  # per stream, as the raw app writes them
    with ExitStack() as stack:
        base, process = stack.enter_context(serving(server, "bench.raw_asgi:application"))
        writer = stack.enter_context(_writing(shape, seconds)) if with_writer else None
        clients = _subscribers(node, base, transport, streams, shape, SETTLE + seconds + DRAIN, False, chunks)
        connect = _connected(clients)
        time.sleep(SETTLE)
        memory = PeakMemory(process.pid)
        memory.start()
        server_cpu = cpu.tree(process)
        if writer is not None:
            writer.start()
        httpx.post(f"{base}/raw/start", json={"streams": streams, "rate": shape.rate, "seconds": seconds}, timeout=60)
        out = _collect(clients, timeout=SETTLE + seconds + DRAIN + 60)
        server_cpu = cpu.tree(process) - server_cpu
        memory.stop.set()
        written = writer.result() if writer is not None else None
    expected = chunks * shape.streams * shape.subscribers
    return {
        **_figures(out, server_cpu, memory.peak, seconds, expected, connect),
        "writer_chunks": sum(written.chunks.values()) if written is not None else None,  # written beside it
    }


def _delivered(out: list[dict[str, Any]]) -> int:
    return sum(r["deliveries"] for r in out)


def _figures(
    out: list[dict[str, Any]], server_cpu: float, peak: int, seconds: float, expected: int, connect: float
) -> dict[str, Any]:
    deliveries = _delivered(out)
    return {
        "connect_s": round(connect, 2),  # until every subscriber had connected
        "deliveries_per_s": round(deliveries / seconds, 1),
        "e2e_ms": _latencies(out),
        "coverage": round(deliveries / expected, 4) if expected else None,
        "duplicates": sum(r["duplicates"] for r in out),
        "gaps": sum(r["gaps"] for r in out),
        "server_cpu_us_per_delivery": cpu.us_per(server_cpu, deliveries, 2),
        "server_cpu_seconds": round(server_cpu, 2),
        "server_peak_mib": round(peak / 2**20, 1),
        "client_cpu_seconds": round(sum(r["cpu_seconds"] for r in out), 2),
        "errors": [e for r in out for e in r["errors"]][:5],
    }


def _idle_run(node: str, server: str, transport: str, connections: int, app: str) -> dict[str, Any]:
    """``connections`` idle subscribers on ``connections // 10`` streams of ``app`` (the demo, or
    the raw ceiling): the server's RSS per connection, and its CPU over ten idle seconds."""
    streams = _make_streams(max(1, connections // 10))
    try:
        with serving(server, app) as (base, process):
            time.sleep(1.0)
            before = _rss(process)
            shape = Shape(len(streams), 10, 1)
            # They stay long enough for the server to follow them, settle and be measured.
            clients = _subscribers(node, base, transport, streams, shape, IDLE_SETTLE + 20.0, idle=True)
            connect = _connected(clients)
            followed = _followed(base, transport, connections) if app.startswith("demo_project") else 0.0
            time.sleep(IDLE_SETTLE)
            idle_cpu, rss = cpu.tree(process), _rss(process)
            time.sleep(10.0)
            idle_cpu = cpu.tree(process) - idle_cpu
            _collect(clients, timeout=60)
    finally:
        _delete_streams()
    return {
        "connections": connections,
        "connect_s": round(connect, 2),
        "followed_s": round(followed, 2),  # after connect_s: until the server followed every one
        "kib_per_connection": round((rss - before) / connections / 1024, 1),
        "idle_cpu_percent": round(idle_cpu / 10.0 * 100, 1),
    }


def run_fanout(config: FanoutConfig, say: Callable[[str], None] = print) -> dict[str, Any]:
    node = _node()
    runs: list[dict[str, Any]] = []
    for server in config.servers:
        for transport in config.transports:
            for shape in config.shapes:
                say(f"fanout: {server}, {transport}, {shape}")
                row: dict[str, Any] = {"server": server, "transport": transport, "shape": str(shape)}
                row["pgstreams"] = _pgstreams_run(node, server, transport, shape, config.seconds)
                if config.ceiling and transport in ("ws", "sse", "ds-sse"):  # the raw app serves these
                    row["ceiling"] = _ceiling_run(node, server, transport, shape, config.seconds, config.ceiling_writer)
                    ceiling = row["ceiling"]["deliveries_per_s"]
                    row["of_ceiling"] = round(row["pgstreams"]["deliveries_per_s"] / ceiling, 3) if ceiling else None
                say(f"fanout:   {json.dumps(row)}")
                runs.append(row)
            if config.idle and transport in ("ws", "sse"):
                say(f"fanout: {server}, {transport}, {config.idle} idle connections")
                row = {"server": server, "transport": transport}
                row["idle"] = _idle_run(node, server, transport, config.idle, "demo_project.asgi:application")
                if config.ceiling:
                    row["ceiling_idle"] = _idle_run(node, server, transport, config.idle, "bench.raw_asgi:application")
                runs.append(row)
    return {"config": asdict(config), "runs": runs}


def table(report: dict[str, Any]) -> str:
    lines = [
        "server   transport shape        connect s  followed s  deliveries/s  p50 ms  p99 ms  max ms  coverage"
        "  us/delivery  of ceiling  raw p99 ms"
    ]
    for row in report["runs"]:
        if "idle" in row:
            idle, raw = row["idle"], row.get("ceiling_idle")
            lines.append(
                f"{row['server']:<8} {row['transport']:<9} {idle['connections']} idle: "
                f"{idle['kib_per_connection']} KiB each, {idle['idle_cpu_percent']}% CPU, connected in "
                f"{idle['connect_s']} s, followed {idle['followed_s']} s later"
                + (f"; the raw app: {raw['kib_per_connection']} KiB each" if raw else "")
            )
            continue
        p, ratio = row["pgstreams"], row.get("of_ceiling")
        e, raw = p["e2e_ms"], row["ceiling"]["e2e_ms"]["p99"] if "ceiling" in row else None
        lines.append(
            f"{row['server']:<8} {row['transport']:<9} {row['shape']:<12} {p['connect_s']:>9} "
            f"{p.get('followed_s', '-'):>11} {p['deliveries_per_s']:>13,.0f} "
            f"{e['p50'] or 0:>7} {e['p99'] or 0:>7} {e['max'] or 0:>7} {p['coverage'] or 0:>9} "
            f"{p['server_cpu_us_per_delivery'] or 0:>12} {'-' if ratio is None else ratio:>11} "
            f"{'-' if raw is None else raw:>11}"
        )
    return "\n".join(
        lines + _cpu_table([row for row in report["runs"] if "total_cpu_us_per_delivery" in row.get("pgstreams", {})])
    )


CPU_COLUMNS: list[Column] = [
    ("server, transport, shape", 30, lambda r: f"{r['server']} {r['transport']} {r['shape']}"),
    ("writer", 9, lambda r: _opt(r["pgstreams"]["writer_cpu_us_per_delivery"], ".1f")),
    ("appender", 9, lambda r: _opt(r["pgstreams"].get("appender_cpu_us_per_delivery"), ".1f")),
    ("postgres", 9, lambda r: _opt(r["pgstreams"]["postgres_cpu_us_per_delivery"], ".1f")),
    ("server", 9, lambda r: _opt(r["pgstreams"]["server_cpu_us_per_delivery"], ".1f")),
    ("sum", 9, lambda r: _opt(r["pgstreams"]["total_cpu_us_per_delivery"], ".1f")),
    ("raw app", 9, lambda r: _opt(r["ceiling"]["server_cpu_us_per_delivery"], ".1f") if "ceiling" in r else "-"),
]


def _cpu_table(rows: list[dict[str, Any]]) -> list[str]:
    """Where a delivery's CPU goes, for the runs that measured it (none in reports made before)."""
    if not rows:
        return []
    return [
        "",
        "CPU per delivery, us: writer = its process (stream_writer and the appender), appender = of which the "
        "appender's thread, postgres = every process of the server, server = the one serving the subscribers; "
        "raw app = its server, the whole of its cost",
        *_grid(CPU_COLUMNS, rows),
    ]
