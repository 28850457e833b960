"""The LLM-shaped benchmark's coordinator (``pgstreams_bench --llm``).

S streams written at T tokens/s each by token writers in W processes (one asyncio task per
stream), followed by R reader processes (one ``aread`` task per stream each or, with ``ws``,
WebSocket clients of one daphne process); the same shape once per write method, each time with
fresh streams and fresh processes. ``find_max`` raises T step by step, S fixed, until the shape
no longer holds. This module creates the streams, starts the processes, releases the writers
together, prints a progress line, samples the server's transaction count during the writing
window and the CPU of Postgres (and, with ``ws``, of daphne) from the release until every child
has reported, and turns what the children report into one row per run. It writes no chunk itself
(the children are in ``llm_procs.py``) and draws nothing (``report.py`` does).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from django.db import connections

from pgstreams import conf

from . import cpu, llm_procs, procs
from .llm_procs import APPEND_METHODS, METHODS, PACE
from .run import CDF_KEYS, LATENCY_KEYS, boot, cleanup, create_streams, machine, percentiles

FIND_MAX_STEPS = 8  # runs at most per method
FIND_MAX_FACTOR = 1.5  # tokens/s per stream, from one step to the next
HOLD_SUSTAINED = 0.95  # a rate holds while sustained >= this share of offered ...
HOLD_P99_MS = 250.0  # ... the e2e p99 stays within this, and every reader got every chunk

XACTS_SQL = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"

Say = Callable[[str], None]


@dataclass
class LlmConfig:
    methods: Sequence[str] = METHODS
    streams: int = 1000
    tokens_per_second: float = 20.0  # per stream
    writer_processes: int = 0  # 0: one per CPU
    readers: int = 1  # reader processes, each following every stream
    duration: float = 10.0  # seconds of writing
    drain: float = 30.0  # seconds after the writing window the readers may take to catch up
    ws: bool = False
    find_max: bool = False


@dataclass
class Channels:
    """What the coordinator and its children share for one run."""

    ready: Any
    results: Any
    go: Any  # set: the writers start
    stop: Any  # set: the drain is over, the readers report what they have
    written: Any  # per writer process: tokens committed so far
    received: Any  # per reader process: chunks received so far

    @classmethod
    def make(cls, ctx: Any, writers: int, readers: int) -> Channels:
        arrays = ctx.Array("q", writers, lock=False), ctx.Array("q", readers, lock=False)
        return cls(ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event(), *arrays)


def run_llm(config: LlmConfig, say: Say = print) -> dict[str, Any]:
    """Every method of ``config`` once, or (``find_max``) each append method's rate sweep."""
    report: dict[str, Any] = {
        "machine": machine(),
        "config": {**asdict(config), "methods": list(config.methods)},
        "llm": [],
        "find_max": None,
    }
    if config.find_max:
        report["find_max"] = [find_max(config, m, say) for m in config.methods if m in APPEND_METHODS]
    else:
        report["llm"] = [run_method(config, m, say) for m in config.methods]
    return report


def find_max(config: LlmConfig, method: str, say: Say = print) -> dict[str, Any]:
    """Raise tokens/s per stream by FIND_MAX_FACTOR from the configured rate until a step does
    not hold; the last rate that held is the answer (None: not even the first)."""
    steps: list[dict[str, Any]] = []
    held, rate = None, config.tokens_per_second
    for _ in range(FIND_MAX_STEPS):
        row = run_method(replace(config, tokens_per_second=rate), method, say)
        steps.append(row)
        if not holds(row):
            break
        held, rate = rate, rate * FIND_MAX_FACTOR
    return {
        "method": method,
        "steps": steps,
        "held_tokens_per_stream_s": held,
        "held_offered_per_s": None if held is None else held * config.streams,
    }


def holds(row: dict[str, Any]) -> bool:
    p99 = row["e2e_ms"]["p99"]
    return (
        row["sustained_per_s"] >= HOLD_SUSTAINED * row["offered_per_s"]
        and p99 is not None
        and p99 <= HOLD_P99_MS
        and row["coverage"] == 1.0
    )


def run_method(config: LlmConfig, method: str, say: Say = print) -> dict[str, Any]:
    """One run of the shape with ``method``: fresh streams, fresh processes; its row (``pace``
    writes nothing, so it runs without readers)."""
    if method == PACE:
        config = replace(config, readers=0)
    ctx = multiprocessing.get_context("spawn")
    children_boot = boot("buffered")
    n_writers = min(config.streams, config.writer_processes or os.cpu_count() or 1)
    streams = create_streams(config.streams)
    channels = Channels.make(ctx, n_writers, config.readers)
    say(
        f"llm, {method}: {config.streams} streams x {config.tokens_per_second:g} tokens/s, writers in "
        f"{n_writers} processes, {config.readers} {'WebSocket' if config.ws else 'aread'} reader processes"
    )
    try:
        with _readers(ctx, children_boot, config, streams, channels) as (readers, memory):
            writers = _writers(ctx, children_boot, config, method, streams, channels)
            server = memory.process if memory is not None else None
            collected, xact_rate, measured = _drive(readers + writers, channels, config, method, say, server)
    finally:
        cleanup()
    server_peak = memory.peak if memory is not None else None
    return summarize(method, config, streams, collected, xact_rate, server_peak, measured)


def _writers(
    ctx: Any, children_boot: procs.Boot, config: LlmConfig, method: str, streams: list[str], channels: Channels
) -> list[Any]:
    shared = (channels.go, channels.ready, channels.results, channels.written)
    return [
        ctx.Process(
            target=llm_procs.token_writer,
            args=(children_boot, method, streams[p :: len(channels.written)], config.tokens_per_second)
            + (config.duration, shared, p),
            name=f"pgstreams-bench-llm-writer-{p}",
        )
        for p in range(len(channels.written))
    ]


@contextlib.contextmanager
def _readers(
    ctx: Any, children_boot: procs.Boot, config: LlmConfig, streams: list[str], channels: Channels
) -> Iterator[tuple[list[Any], Any]]:
    """The reader processes, and the memory sampler of the process that reads for them: None
    for ``aread`` readers (they sample their own), the daphne server's with ``ws``, which then
    runs for the block."""
    if not config.ws:
        shared = (channels.ready, channels.stop, channels.results, channels.received)
        yield (
            [
                ctx.Process(
                    target=llm_procs.token_reader,
                    args=(children_boot, streams, shared, r),
                    name=f"pgstreams-bench-llm-reader-{r}",
                )
                for r in range(config.readers)
            ],
            None,
        )
        return
    with _daphne(ctx, children_boot) as (port, memory):
        everyone, timeout = list(range(len(streams))), config.duration + config.drain
        args = (f"ws://127.0.0.1:{port}", streams, everyone, timeout, channels.ready, channels.results)
        yield (
            [
                ctx.Process(target=procs.ws_clients, args=args, name=f"pgstreams-bench-llm-ws-{r}")
                for r in range(config.readers)
            ],
            memory,
        )


@contextlib.contextmanager
def _daphne(ctx: Any, children_boot: procs.Boot) -> Iterator[tuple[int, Any]]:
    """The project's ASGI application in a daphne process for the block: its port and the
    sampler of its peak memory."""
    from .ws import PeakMemory, _free_port, _wait_for_port

    port = _free_port()
    server = ctx.Process(target=procs.server, args=(children_boot, port), name="pgstreams-bench-daphne")
    server.start()
    memory = PeakMemory(server.pid)
    try:
        _wait_for_port(port, server)
        memory.start()
        yield port, memory
    finally:
        memory.stop.set()
        server.terminate()
        server.join(10)
        if server.is_alive():
            server.kill()


def _drive(
    children: list[Any], channels: Channels, config: LlmConfig, method: str, say: Say, server: Any
) -> tuple[list[tuple[str, Any]], float, dict[str, float]]:
    """Start the children, release the writers once all are ready, and return one (kind,
    result) from each child with the server's transactions/s during the writing window and the
    CPU seconds (``_cpu_now``) from the release until every child has reported."""
    try:
        for child in children:
            child.start()
        for _ in children:
            channels.ready.get(timeout=120)
        postmaster = cpu.postmaster()
        samples, before = [(time.monotonic(), _xacts())], _cpu_now(postmaster, server)
        channels.go.set()
        samples += _window(channels, config, method, say)
        collected = _collect(len(children), channels, config, method, samples[0][0], say)
        measured = {part: seconds - before[part] for part, seconds in _cpu_now(postmaster, server).items()}
        for child in children:
            child.join(30)
        return collected, _xact_rate(samples), measured
    finally:
        for child in children:
            if child.is_alive():
                child.kill()


def _cpu_now(postmaster: Any, server: Any) -> dict[str, float]:
    """CPU seconds so far of Postgres and, with --ws, of the daphne server (``aread`` readers
    measure their own)."""
    return {"postgres": cpu.postgres(postmaster), **({"server": cpu.tree(server)} if server is not None else {})}


def _xacts() -> int:
    """The database's transactions so far (each backend reports its counts within a second)."""
    with connections[conf.database()].cursor() as cursor:
        cursor.execute(XACTS_SQL)
        return cursor.fetchone()[0]


def _xact_rate(samples: list[tuple[float, int]]) -> float:
    """Transactions/s from the first sample in the window (1 s in, once counts flow and lag like
    the last sample's) to the last; from the release when the window had only one sample."""
    (t0, x0), (t1, x1) = samples[1] if len(samples) > 2 else samples[0], samples[-1]
    return round((x1 - x0) / (t1 - t0), 1) if t1 > t0 else 0.0


def _window(channels: Channels, config: LlmConfig, method: str, say: Say) -> list[tuple[float, int]]:
    """A progress line and a transaction count every second until the writing window ends."""
    started = time.monotonic()
    end = started + config.duration
    samples: list[tuple[float, int]] = []
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(1.0, left))
        samples.append((time.monotonic(), _xacts()))
        say(_progress(method, channels, samples[-1][0] - started, config.ws))
    return samples


def _collect(count: int, channels: Channels, config: LlmConfig, method: str, go_at: float, say: Say) -> list[Any]:
    """The children's results; the readers are stopped ``drain`` seconds after the window."""
    drained_at = go_at + config.duration + config.drain
    collected: list[Any] = []
    while len(collected) < count:
        now = time.monotonic()
        if now >= drained_at:
            channels.stop.set()
        if now >= drained_at + 120:
            raise RuntimeError(f"{count - len(collected)} benchmark processes did not report in time")
        try:
            collected.append(channels.results.get(timeout=1.0))
        except queue.Empty:
            say(_progress(method, channels, now - go_at, config.ws) + ", draining")
    return collected


def _progress(method: str, channels: Channels, elapsed: float, ws: bool) -> str:
    received = "-" if ws or not len(channels.received) else f"{min(channels.received):,}"
    return f"  {method}: {elapsed:5.1f} s, {sum(channels.written):,} committed, {received} received"


def summarize(
    method: str,
    config: LlmConfig,
    streams: list[str],
    collected: list[tuple[str, Any]],
    xact_rate: float,
    server_peak: int | None,
    measured: dict[str, float],
) -> dict[str, Any]:
    writers = [r for kind, r in collected if kind == "writer"]
    readers = [r for kind, r in collected if kind != "writer"]
    starts: dict[str, Any] = {}
    for w in writers:
        starts.update(w.starts)
    by_index = [starts[sid] for sid in streams]
    committed = sum(len(times) for times in by_index)
    e2e = [seconds for r in readers for seconds in _e2e(r, by_index)]
    received = min((len(r.offset) for r in readers), default=None)  # None: no reader (--readers 0)
    return {
        "method": method,
        "ws": config.ws,
        "streams": config.streams,
        "tokens_per_stream_s": config.tokens_per_second,
        "offered_per_s": round(config.streams * config.tokens_per_second, 1),
        "sustained_per_s": round(sum(w.committed_in_window / w.window_seconds for w in writers), 1),
        "committed": committed,
        "backlog": None if received is None else committed - received,
        "coverage": round(received / committed, 6) if committed and received is not None else None,
        "e2e_ms": percentiles(e2e, LATENCY_KEYS),
        "e2e_cdf_ms": list(percentiles(e2e, CDF_KEYS).values()) if e2e else [],
        "duplicates": sum(r.duplicates for r in readers),
        "out_of_order": sum(r.out_of_order for r in readers),
        "xact_per_s": xact_rate,
        **_reader_figures(readers, server_peak),
        **_writer_figures(writers, config.duration),
        **_cpu_figures(writers, readers, measured),
    }


def _e2e(reader: Any, starts: list[Any]) -> Iterator[float]:
    """Each receipt's time since its token's write call began (offsets with no known start,
    after a write error, are left out)."""
    for index, offset, received in zip(reader.stream, reader.offset, reader.received, strict=True):
        times = starts[index]
        if offset < len(times):
            yield max(0.0, received - times[offset])


def _reader_figures(readers: list[Any], server_peak: int | None) -> dict[str, Any]:
    """Memory (each reader process's peak; with --ws, the daphne server's) and the listeners'
    decode cost per notification entry (not known with --ws: the listener is daphne's)."""
    listener = _summed([r.listener for r in readers if hasattr(r, "listener")])
    entries, fetches = listener.get("entries", 0), listener.get("fetches", 0)
    peak = server_peak if server_peak is not None else max((getattr(r, "peak_rss", 0) for r in readers), default=0)
    return {
        "reader_peak_mib": round(peak / 2**20, 1),
        "decode_us_per_entry": round(1e6 * listener["hear_seconds"] / entries, 3) if entries else None,
        "unfollowed_us_per_entry": max((getattr(r, "unfollowed_us", 0.0) for r in readers), default=None) or None,
        "fetch_ms_mean": round(1000 * listener["fetch_seconds"] / fetches, 2) if fetches else None,
        "chunks_per_fetch": round(listener["chunks_fetched"] / fetches, 1) if fetches else None,
        "listener": listener,
        "unfinished_streams": sum(getattr(r, "unfinished", 0) for r in readers),
        "reader_errors": [e for r in readers for e in r.errors][:10],
    }


def _writer_figures(writers: list[llm_procs.TokenWriterResult], duration: float) -> dict[str, Any]:
    """The write calls (aappend, awrite), how late the writers ran against their schedule, the
    appender's batches (append methods), and the writer processes' CPU per token (pacing, the
    calls and, for the append methods, the appender's thread, whose share is given too, as is the
    garbage collector's)."""
    appended = [w.appender for w in writers if w.appender is not None]
    batches = sum(a["batches"] for a in appended)
    tokens = sum(len(times) for w in writers for times in w.starts.values())
    calls = [s for w in writers for s in w.call_seconds]
    return {
        "write_call_ms": percentiles(calls, LATENCY_KEYS) if calls else None,
        "schedule_lag_ms": percentiles([s for w in writers for s in w.lag_seconds], LATENCY_KEYS),
        "window_counted_late_ms": round(1000 * max(w.window_seconds for w in writers) - 1000 * duration, 1),
        "appender_batches": batches if appended else None,
        "mean_batch": round(sum(a["appended"] for a in appended) / batches, 1) if batches else None,
        "appender_retries": sum(a["retries"] for a in appended) if appended else None,
        "writer_cpu_us_per_token": round(1e6 * sum(w.cpu_seconds for w in writers) / tokens, 1) if tokens else None,
        "writer_gc_us_per_token": round(1e6 * sum(w.gc_seconds for w in writers) / tokens, 1) if tokens else None,
        "appender_cpu_us_per_token": (
            round(1e6 * sum(a["cpu_seconds"] for a in appended) / tokens, 1) if appended and tokens else None
        ),
        "flusher": _summed([w.flusher for w in writers if w.flusher]),
        "write_errors": sum(w.errors for w in writers),
    }


def _cpu_figures(writers: list[Any], readers: list[Any], measured: dict[str, float]) -> dict[str, Any]:
    """Where a delivered token's CPU goes (``cpu.per_delivery``), per token a reader received: the
    writer processes' (their appender included), Postgres' and the server's, which is the daphne
    process with --ws (``measured``), else the ``aread`` reader processes (their own count)."""
    seconds = {
        "writer": sum(w.cpu_seconds for w in writers),
        "postgres": measured.get("postgres"),
        "server": measured["server"] if "server" in measured else sum(r.cpu_seconds for r in readers),
    }
    return cpu.per_delivery(seconds, sum(len(r.offset) for r in readers))


def _summed(counts: list[dict[str, Any]]) -> dict[str, Any]:
    """Stats dicts (``as_dict()`` of one kind) added up field by field; {} for none."""
    return {key: sum(c[key] for c in counts) for key in counts[0]} if counts else {}
