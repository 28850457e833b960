"""The benchmark's fleet runs: several reader processes on one Postgres.

``run_frozen`` (``--frozen``): one writer process and ``readers`` reader processes following
every stream, on a scratch server whose notification queue fills in seconds
(``max_notify_queue_pages``); one reader is stopped (SIGSTOP) for ``stopped`` seconds and
continued. It reports the other readers' latency before, during and after the stop, window by
window, the writes and flushes that failed, when the stopped reader's listener session was
ended and how full the queue got, and whether the stopped reader, once continued, got every
chunk once and in order, and how long it took.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from queue import Empty
from typing import Any

from . import cpu, procs, run
from .scratch import ScratchServer, installed
from .ws import _free_port

ALIAS = "pgstreams_fleet"


@dataclass
class FrozenConfig:
    mode: str = "buffered"  # NOTIFY_MODE: "buffered" or "per_write"
    readers: int = 3  # reader processes; the last is stopped
    streams: int = 100
    rate: float = 400.0  # chunks/s written in total, by 4 threads
    before: float = 10.0  # seconds of writing before the stop
    stopped: float = 60.0
    after: float = 15.0  # seconds of writing after SIGCONT
    queue_pages: int = 64  # max_notify_queue_pages: 64 pages of 8 kB, PostgreSQL's least
    guard: float | None = 0.001  # NOTIFY_QUEUE_GUARD; None: no process ends a listener
    check_interval: float = 1.0  # LISTEN_CHECK_INTERVAL: a listener is stuck after 3 of them
    window: float = 5.0  # seconds per latency window
    tcp: bool = False  # every connection over TCP on 127.0.0.1 (else the server's Unix socket)


WRITER_THREADS = 4


def run_frozen(config: FrozenConfig, say: Callable[[str], None] = print) -> dict[str, Any]:
    say(f"frozen reader, {config.mode}: a server whose notification queue holds {config.queue_pages} pages")
    tcp_port = _free_port() if config.tcp else None
    server = ScratchServer(max_notify_queue_pages=config.queue_pages, tcp_port=tcp_port)
    with server, installed({ALIAS: server.database()}, ALIAS):
        settings = {
            "DATABASE": ALIAS,
            "LISTEN_CHECK_INTERVAL": config.check_interval,
            "NOTIFY_QUEUE_GUARD": config.guard,
        }
        with run._pgstreams_settings(**settings):
            streams = run.create_streams(config.streams)
            boot = run.boot(config.mode)
        with server.connect() as watch:
            report = _drive(config, boot, streams, watch, say)
    report["config"] = asdict(config)
    report["machine"] = {**run.machine(), "postgres": report.pop("postgres")}
    return report


def _drive(config: FrozenConfig, boot: procs.Boot, streams: list[str], watch: Any, say: Callable[[str], None]) -> dict:
    ctx = multiprocessing.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    duration = config.before + config.stopped + config.after
    readers = [
        ctx.Process(
            target=procs.reader,
            args=(boot, streams, 1, duration + 120, ready, results),
            name=f"pgstreams-fleet-reader-{r}",
        )
        for r in range(config.readers)
    ]
    writer = _writer(ctx, boot, streams, WRITER_THREADS, config.rate, duration, (go, ready, results))
    children = [*readers, writer]
    for child in children:
        child.start()
    try:
        for _ in children:
            _get(ready, children, 120)  # every child says it is ready
        frozen = readers[-1].pid
        go.set()
        began = time.monotonic()
        samples = _watch(watch, frozen, began, config, say)
        collected = [_get(results, children, 180) for _ in children]
    finally:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGCONT)  # a run that failed mid-stop leaves none stopped
            child.join(30)
            if child.is_alive():
                child.kill()
    postgres = watch.execute("SHOW server_version").fetchone()[0]
    written = next(result for kind, result in collected if kind == "writer")
    by_pid = {result.pid: result for kind, result in collected if kind == "reader"}
    stop_at, cont_at = began + config.before, began + config.before + config.stopped
    return {
        "postgres": postgres,
        "write_errors": written.errors,
        "failed_flushes": written.failed_flushes,
        "written": sum(len(times) for times in written.commits.values()),
        "healthy": [
            _healthy(by_pid[r.pid], written, streams, began, stop_at, cont_at, config.window) for r in readers[:-1]
        ],
        "frozen": _frozen(by_pid[frozen], written, streams, cont_at),
        **samples,
    }


def _writer(
    ctx: Any, boot: procs.Boot, streams: list[str], threads: int, rate: float, duration: float, queues: tuple
) -> Any:
    """The writer process: ``threads`` threads writing ``rate`` chunks/s of 64 bytes in all, over
    ``streams`` dealt among them, for ``duration`` s once ``go`` is set."""
    go, ready, results = queues
    progress = ctx.Array("q", 1, lock=False)
    args = (boot, run.spread(streams, threads), duration, threads / rate, 64, go, ready, results, progress, 0)
    return ctx.Process(target=procs.writer, args=args, name="pgstreams-fleet-writer")


def _get(queue: Any, children: list[Any], timeout: float) -> Any:
    """The next item of ``queue``; an error as soon as a child has failed, or after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:  # bounded by the deadline
        try:
            return queue.get(timeout=0.5)
        except Empty:
            failed = [child for child in children if child.exitcode not in (None, 0)]
            if failed:
                raise RuntimeError(f"{failed[0].name} exited with {failed[0].exitcode}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"no word from the fleet's processes within {timeout:g} s") from None


def _watch(conn: Any, frozen: int, began: float, config: FrozenConfig, say: Callable[[str], None]) -> dict[str, Any]:
    """Stop and continue the frozen reader on time; meanwhile, four times a second, read the
    queue's usage and whether the frozen reader's listener session is still there."""
    name = f"pgstreams listener {frozen}"
    stop_at = began + config.before
    cont_at = stop_at + config.stopped
    end = cont_at + config.after
    stopped = continued = False
    cut: float | None = None
    peak = 0.0
    usage_at_cont = None
    while (now := time.monotonic()) < end:  # bounded by the run's duration
        if not stopped and now >= stop_at:
            os.kill(frozen, signal.SIGSTOP)
            stopped = True
            say(f"  reader {frozen} stopped for {config.stopped:g} s")
        if stopped and not continued and now >= cont_at:
            os.kill(frozen, signal.SIGCONT)
            continued = True
            say(f"  reader {frozen} continued")
        usage, present = conn.execute(
            "SELECT pg_notification_queue_usage(), count(*) FILTER (WHERE application_name = %s) FROM pg_stat_activity",
            [name],
        ).fetchone()
        if stopped and not continued:
            peak = max(peak, usage)
            if cut is None and not present:
                cut = time.monotonic() - stop_at
                say(f"  its listener session was ended {cut:.1f} s after the stop, the queue {100 * peak:.1f}% full")
        if continued and usage_at_cont is None:
            usage_at_cont = usage
        time.sleep(0.25)
    return {
        "listener_ended_after_s": None if cut is None else round(cut, 2),
        "queue_peak": round(peak, 4),
        "queue_at_continue": usage_at_cont,
    }


def _latencies(result: procs.Arrivals, written: procs.WriterResult, streams: list[str]) -> list[tuple[float, float]]:
    """(commit time, latency) of every chunk the reader got."""
    pairs = []
    for index, offset, received in zip(result.stream, result.offset, result.received, strict=True):
        commit = written.commits[streams[index]][offset]
        pairs.append((commit, received - commit))
    return pairs


def _healthy(
    result: procs.ReaderResult,
    written: procs.WriterResult,
    streams: list[str],
    began: float,
    stop_at: float,
    cont_at: float,
    window: float,
) -> dict[str, Any]:
    """A reader that ran throughout: its latency by the phase and window its chunks were committed in."""
    pairs = _latencies(result, written, streams)
    phases = {
        "before": [lat for at, lat in pairs if began + 1 <= at < stop_at],  # the first second warms up
        "during": [lat for at, lat in pairs if stop_at <= at < cont_at],
        "after": [lat for at, lat in pairs if at >= cont_at],
    }
    windows: dict[int, list[float]] = {}
    for at, lat in pairs:
        windows.setdefault(int((at - began) // window), []).append(lat)
    keys = {"p50": 0.5, "p99": 0.99, "max": 1.0}
    return {
        "pid": result.pid,
        **_completeness(result, written),
        "reconnects": result.reconnects,
        "phases": {phase: run.percentiles(values, keys) for phase, values in phases.items()},
        "windows_p99": [
            (round(index * window, 1), run.percentiles(windows[index], {"p99": 0.99})["p99"])
            for index in sorted(windows)
        ],
    }


def _frozen(result: procs.ReaderResult, written: procs.WriterResult, streams: list[str], cont_at: float) -> dict:
    """The stopped reader: complete, and how long after SIGCONT it had every chunk committed before it."""
    pairs = zip(result.stream, result.offset, result.received, strict=True)
    caught_up = max(
        (received for index, offset, received in pairs if written.commits[streams[index]][offset] < cont_at),
        default=cont_at,
    )
    return {
        "pid": result.pid,
        **_completeness(result, written),
        "caught_up_after_s": round(caught_up - cont_at, 2),
        "error": result.error,
    }


def _completeness(result: procs.ReaderResult, written: procs.WriterResult) -> dict[str, Any]:
    total = sum(len(times) for times in written.commits.values())
    return {
        "received": len(result.offset),
        "coverage": round(len(result.offset) / total, 6) if total else None,
        "duplicates": result.duplicates,
        "out_of_order": result.out_of_order,
    }


def frozen_table(report: dict[str, Any]) -> str:
    config = report["config"]
    lines = [
        f"frozen reader ({config['mode']}{', TCP' if config['tcp'] else ''}, queue {config['queue_pages']} pages, "
        f"guard {config['guard']}): "
        f"{report['written']} chunks written, {report['write_errors']} writes and {report['failed_flushes']} "
        f"flushes failed; listener ended {report['listener_ended_after_s']} s after the stop, "
        f"queue peak {100 * report['queue_peak']:.1f}%",
        f"{'reader':>8} {'phase':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}",
    ]
    for reader in report["healthy"]:
        for phase, figures in reader["phases"].items():
            lines.append(
                f"{reader['pid']:>8} {phase:>7} {figures['p50'] or 0:>8.1f} {figures['p99'] or 0:>8.1f} "
                f"{figures['max'] or 0:>8.1f}"
            )
    frozen = report["frozen"]
    lines.append(
        f"stopped reader {frozen['pid']}: coverage {frozen['coverage']}, {frozen['duplicates']} duplicates, "
        f"{frozen['out_of_order']} out of order, caught up {frozen['caught_up_after_s']} s after SIGCONT"
    )
    return "\n".join(lines)


@dataclass
class FleetConfig:
    processes: Sequence[int] = (1, 2, 4, 8, 16)  # reader processes, one run each
    shape: str = "share"  # "share": each stream followed in one process; "broadcast": in every one
    shards: int = 1  # NOTIFY_SHARDS
    streams: int = 1000
    rate: float = 2000.0  # chunks/s written in total
    writer_threads: int = 8
    duration: float = 10.0  # seconds of writing per run


SHAPES = ("share", "broadcast")


def run_fleet(config: FleetConfig, say: Callable[[str], None] = print) -> dict[str, Any]:
    """One run per reader process count, against the project's database."""
    rows = []
    with run._pgstreams_settings(NOTIFY_SHARDS=config.shards):
        boot = run.boot("buffered")
        try:
            for count in config.processes:
                streams = run.create_streams(config.streams)
                say(f"fleet, {config.shape}, {config.shards} shard(s): {count} reader process(es)")
                rows.append(_fleet_run(config, boot, streams, count))
                run.cleanup()
        finally:
            run.cleanup()
    return {"machine": run.machine(), "config": asdict(config), "rows": rows}


def _fleet_run(config: FleetConfig, boot: procs.Boot, streams: list[str], count: int) -> dict[str, Any]:
    import psutil

    ctx = multiprocessing.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    followed = [streams] * count if config.shape == "broadcast" else run.spread(streams, count)
    readers = [
        ctx.Process(target=procs.reader, args=(boot, mine, 1, config.duration + 120, ready, results))
        for mine in followed
    ]
    writer = _writer(ctx, boot, streams, config.writer_threads, config.rate, config.duration, (go, ready, results))
    children = [*readers, writer]
    for child in children:
        child.start()
    try:
        for _ in children:
            _get(ready, children, 300)
        postmaster = cpu.postmaster()
        reading = [psutil.Process(r.pid) for r in readers]
        postgres_before, readers_before = cpu.postgres(postmaster), cpu.each(reading)
        go.set()
        began = time.monotonic()
        # CPU over the writing, up to just before its end: then the writer closes the streams and
        # the readers, done, exit, and their CPU could no longer be asked.
        time.sleep(max(0.5, config.duration - 0.2))
        postgres_cpu = cpu.postgres(postmaster) - postgres_before
        readers_cpu = sum(cpu.each(reading, since=readers_before).values())
        measured = time.monotonic()
        collected = [_get(results, children, 180) for _ in children]
    finally:
        for child in children:
            child.join(30)
            if child.is_alive():
                child.kill()
    written = next(result for kind, result in collected if kind == "writer")
    got = [result for kind, result in collected if kind == "reader"]
    followed_by = {reader.pid: mine for reader, mine in zip(readers, followed, strict=True)}
    latencies = [lat for result in got for _, lat in _latencies(result, written, followed_by[result.pid])]
    expected = sum(len(written.commits[sid]) for mine in followed for sid in mine)
    elapsed = measured - began
    delivered = sum(1 for result in got for at in result.received if at <= measured)  # in the CPU's window
    return {
        "processes": count,
        "written": sum(len(times) for times in written.commits.values()),
        "deliveries_per_s": round(delivered / elapsed, 1),
        "e2e_ms": run.percentiles(latencies, {"p50": 0.5, "p99": 0.99}),
        "coverage": round(len(latencies) / expected, 6) if expected else None,
        "duplicates": sum(r.duplicates for r in got),
        # Over each reader's own run, from its start to its streams' end.
        "entries_per_process_s": round(sum(r.entries / r.elapsed for r in got) / len(got), 1),
        "notifications_per_process_s": round(sum(r.notifications / r.elapsed for r in got) / len(got), 1),
        "fetches_per_process_s": round(sum(r.fetches / r.elapsed for r in got) / len(got), 1),
        "postgres_us_per_delivery": cpu.us_per(postgres_cpu, delivered),
        "readers_us_per_delivery": cpu.us_per(readers_cpu, delivered),
    }


def fleet_table(report: dict[str, Any]) -> str:
    config = report["config"]
    lines = [
        f"fleet, {config['shape']}, NOTIFY_SHARDS {config['shards']}: {config['streams']} streams, "
        f"{config['rate']:g} chunks/s, {report['machine']['postgres']}",
        f"{'P':>3} {'deliv/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'coverage':>9} {'entries/s/proc':>15} "
        f"{'pg us/deliv':>12} {'readers us/deliv':>17}",
    ]
    for row in report["rows"]:
        e2e = row["e2e_ms"]
        lines.append(
            f"{row['processes']:>3} {row['deliveries_per_s']:>9.0f} {e2e['p50'] or 0:>8.1f} {e2e['p99'] or 0:>8.1f} "
            f"{row['coverage']:>9} {row['entries_per_process_s']:>15.0f} {row['postgres_us_per_delivery']:>12} "
            f"{row['readers_us_per_delivery']:>17}"
        )
    return "\n".join(lines)
