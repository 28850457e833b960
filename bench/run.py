"""The benchmark's coordinator: for each mode, create the streams, start reader and writer
processes, release the writers together, collect their timings and turn them into the figures
of one run. Nothing here writes chunks itself."""

from __future__ import annotations

import multiprocessing
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from django.conf import settings
from django.db import connections
from django.test import override_settings

from pgstreams import conf
from pgstreams.conf import SYNCHRONOUS_COMMIT_LEVELS
from pgstreams.models import Stream

from . import procs

MODES = ("insert_only", "buffered", "per_write", "off")
LABEL = "pgstreams-bench"


@dataclass
class Config:
    modes: Sequence[str] = MODES
    writers: int = 32
    writer_processes: int = 0  # 0: as many as the machine has cores
    streams_per_writer: int = 1
    readers: int = 2
    fanout: int = 1
    duration: float = 10.0
    rate: float | None = None  # writes/s in total; None: flat out
    chunk_bytes: int = 64
    drain: float = 30.0  # seconds readers may take to catch up after the writers stop
    ws: bool = False
    clients: int = 50
    pgbench: bool = True
    replica_writers: Sequence[int] = ()  # writer counts of the replica sweep; () runs none


def percentiles(values: Sequence[float], keys: dict[str, float], scale: float = 1000.0) -> dict[str, float | None]:
    """Nearest-rank percentiles (key -> fraction), in milliseconds by default."""
    if not values:
        return {key: None for key in keys}
    ordered = sorted(values)
    last = len(ordered) - 1
    return {key: round(ordered[min(last, int(q * len(ordered)))] * scale, 3) for key, q in keys.items()}


LATENCY_KEYS = {"p50": 0.50, "p95": 0.95, "p99": 0.99, "p999": 0.999, "max": 1.0}
CDF_KEYS = {str(i): i / 100 for i in range(101)}  # for the plot: the latency at each percent


def host() -> dict[str, Any]:
    """The machine a run is on, without asking the database."""
    import psutil

    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
    }


def machine() -> dict[str, Any]:
    with connections[conf.database()].cursor() as cursor:
        cursor.execute("SHOW server_version")
        server = cursor.fetchone()[0]
    return {**host(), "postgres": server}


def run(config: Config, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every mode of ``config`` in turn, then the pgbench ceiling; return the report."""
    from .ceiling import pgbench_tps

    report: dict[str, Any] = {
        "machine": machine(),
        "config": {
            **asdict(config),
            "modes": list(config.modes),
            "flush_interval": conf.flush_interval(),
            "poll_interval": conf.poll_interval(),
        },
        "pgbench_tps": None,
        "pgbench_notify_tps": None,
        "runs": [],
        "ws": None,
        "replica": None,
    }
    for mode in config.modes:
        report["runs"].append(run_mode(config, mode, say))
    if config.pgbench:
        say(f"pgbench: the write statement from {config.writers} C clients, plain then with pg_notify")
        report["pgbench_tps"] = pgbench_tps(conf.database(), config.writers, config.duration, notify=False)
        report["pgbench_notify_tps"] = pgbench_tps(conf.database(), config.writers, config.duration, notify=True)
    if config.ws:
        from .ws import run_ws

        report["ws"] = run_ws(config, say)
    if config.replica_writers:
        report["replica"] = run_replica(config, say)
    return report


def run_replica(config: Config, say: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Each synchronous_commit level at each of ``config.replica_writers`` writer counts, in
    buffered mode: writers on a primary whose synchronous standby the readers read from (a pair
    built from the embedded binaries for this run, see ``replica.py``)."""
    from .replica import ReplicaPair, installed

    rows = []
    say("replica: building a primary and a synchronous streaming standby")
    with ReplicaPair() as pair, installed(pair, "pgstreams_bench") as (primary, standby):
        for level in SYNCHRONOUS_COMMIT_LEVELS:
            for writers in config.replica_writers:
                say(f"replica, synchronous_commit = {level}:")
                with _pgstreams_settings(DATABASE=primary, READ_DATABASE=standby, SYNCHRONOUS_COMMIT=level):
                    run = run_mode(replace(config, writers=writers), "buffered", say)
                rows.append({"level": level, **{key: run[key] for key in REPLICA_KEYS}})
    return rows


REPLICA_KEYS = (
    "writers",
    "writes_per_s",
    "write_ms",
    "e2e_ms",
    "written",
    "coverage",
    "duplicates",
    "out_of_order",
    "fetches_behind",
)


def _pgstreams_settings(**values: Any) -> override_settings:
    """settings.PGSTREAMS with ``values`` on top, for the block (the children get it by Boot).
    LISTEN_DATABASE is reset: the project's own listener alias is not the benchmark's database."""
    return override_settings(
        PGSTREAMS={**(getattr(settings, "PGSTREAMS", None) or {}), "LISTEN_DATABASE": None, **values}
    )


def boot(mode: str) -> procs.Boot:
    notify_mode = "off" if mode == "insert_only" else mode
    aliases = {conf.database(), conf.read_database(), conf.listen_database()}
    return procs.Boot(
        settings_module=os.environ.get("DJANGO_SETTINGS_MODULE", settings.SETTINGS_MODULE),
        alias=conf.database(),
        databases={alias: dict(connections[alias].settings_dict) for alias in aliases},
        pgstreams={**(getattr(settings, "PGSTREAMS", None) or {}), "NOTIFY_MODE": notify_mode},
    )


def create_streams(count: int) -> list[str]:
    made = Stream.objects.using(conf.database()).bulk_create(Stream(label=LABEL) for _ in range(count))
    return [str(s.id) for s in made]


def cleanup() -> None:
    """Delete the benchmark's streams (their chunks go with them) and tidy the tables."""
    alias = conf.database()
    Stream.objects.using(alias).filter(label=LABEL).delete()
    with connections[alias].cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE) pgstreams_stream, pgstreams_chunk")


def spread(items: list[Any], parts: int) -> list[list[Any]]:
    """Deal ``items`` round-robin into ``parts`` lists."""
    return [items[i::parts] for i in range(parts)]


def run_mode(config: Config, mode: str, say: Callable[[str], None] = print) -> dict[str, Any]:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; the modes are {', '.join(MODES)}")
    ctx = multiprocessing.get_context("spawn")
    settings_for_children = boot(mode)
    n_readers = 0 if mode == "insert_only" else config.readers
    n_procs = min(config.writers, config.writer_processes or os.cpu_count() or 1)
    streams = create_streams(config.writers * config.streams_per_writer)

    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    progress = ctx.Array("q", n_procs, lock=False)
    children = [
        ctx.Process(
            target=procs.reader,
            args=(settings_for_children, streams, config.fanout, config.duration + config.drain + 30, ready, results),
            name=f"pgstreams-bench-reader-{r}",
        )
        for r in range(n_readers)
    ] + writer_processes(ctx, settings_for_children, config, streams, (go, ready, results, progress))
    say(f"{mode}: {config.writers} writers in {n_procs} processes, {n_readers} reader processes x {config.fanout}")
    try:
        collected = drive(children, config, ready, results, go, progress)
    finally:
        cleanup()
    writers = [r for kind, r in collected if kind == "writer"]
    readers = [r for kind, r in collected if kind == "reader"]
    return summarize(mode, config, streams, n_readers, writers, readers)


def writer_processes(
    ctx: Any, settings_for_children: procs.Boot, config: Config, streams: list[str], channels: tuple[Any, ...]
) -> list[Any]:
    """The writer processes: ``config.writers`` threads, one per stream group, dealt over processes."""
    n_procs = min(config.writers, config.writer_processes or os.cpu_count() or 1)
    per_thread = [streams[i :: config.writers] for i in range(config.writers)]
    interval = config.writers / config.rate if config.rate else 0.0
    go, ready, results, progress = channels
    return [
        ctx.Process(
            target=procs.writer,
            args=(settings_for_children, threads, config.duration, interval, config.chunk_bytes)
            + (go, ready, results, progress, p),
            name=f"pgstreams-bench-writer-{p}",
        )
        for p, threads in enumerate(spread(per_thread, n_procs))
    ]


def drive(children: list[Any], config: Config, ready: Any, results: Any, go: Any, progress: Any) -> list[Any]:
    """Start the children, wait until each is ready, release the writers together, show a
    progress line while they write, and return one (kind, result) from each child."""
    try:
        for child in children:
            child.start()
        for _ in children:
            ready.get(timeout=120)
        go.set()
        started = time.monotonic()
        while (left := config.duration - (time.monotonic() - started)) > 0:
            time.sleep(min(1.0, left))  # a second per progress line, none past the window
            elapsed = time.monotonic() - started
            sys.stderr.write(f"\r  {elapsed:4.0f}/{config.duration:.0f} s  {sum(progress) / elapsed:9.0f} writes/s ")
            sys.stderr.flush()
        sys.stderr.write("\n")
        collected = [results.get(timeout=config.duration + config.drain + 120) for _ in children]
        for child in children:
            child.join(30)
        return collected
    finally:
        for child in children:
            if child.is_alive():
                child.kill()


def summarize(
    mode: str,
    config: Config,
    streams: list[str],
    n_readers: int,
    writers: list[procs.WriterResult],
    readers: list[procs.ReaderResult],
) -> dict[str, Any]:
    commits: dict[str, Any] = {}
    latencies: list[float] = []
    for w in writers:
        commits.update(w.commits)
        latencies.extend(w.latencies)
    written = sum(len(c) for c in commits.values())
    span = max(w.finished for w in writers) - min(w.started for w in writers)
    e2e: list[float] = []
    for r in readers:
        for index, offset, received in zip(r.stream, r.offset, r.received, strict=True):
            e2e.append(max(0.0, received - commits[streams[index]][offset]))
    expected = written * n_readers * config.fanout
    elapsed = max((r.elapsed for r in readers), default=0.0) or 1.0
    return {
        "mode": mode,
        "writers": config.writers,
        "readers": n_readers,
        "fanout": config.fanout,
        "written": written,
        "write_errors": sum(w.errors for w in writers),
        "writes_per_s": round(written / span, 1),
        "write_ms": percentiles(latencies, LATENCY_KEYS),
        "e2e_ms": percentiles(e2e, LATENCY_KEYS),
        "e2e_cdf_ms": list(percentiles(e2e, CDF_KEYS).values()) if e2e else [],
        "coverage": round(len(e2e) / expected, 6) if expected else None,
        "duplicates": sum(r.duplicates for r in readers),
        "out_of_order": sum(r.out_of_order for r in readers),
        "reader_backends": sum(r.backends for r in readers),
        "reader_backends_per_process": [r.backends for r in readers],
        "poll_queries_per_s": round(sum(r.polls for r in readers) / elapsed, 2),
        "poll_queries_per_s_per_process": [round(r.polls / (r.elapsed or 1.0), 2) for r in readers],
        "fetch_queries_per_s": round(sum(r.fetches for r in readers) / elapsed, 1),
        "fetches_behind": round(sum(r.behind for r in readers) / max(1, sum(r.fetches for r in readers)), 4),
        "fetch_ms_mean": round(
            1000 * sum(r.fetch_seconds for r in readers) / max(1, sum(r.fetches for r in readers)), 2
        ),
        "reader_errors": [r.error for r in readers if r.error],
    }
