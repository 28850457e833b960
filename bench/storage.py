"""What a chunk costs on disk (``pgstreams_bench --storage``).

For each write shape (``SHAPES``: LLM tokens of 4 bytes, log lines of 100), chunks are written as
that shape's writers write them, ``stream_writer`` in one asyncio task per stream, every stream
advancing a chunk at a time, on a scratch server of the run's own (``bench.scratch``: nothing else
writes there, so its WAL is theirs). Then, beside the data's own bytes: the chunk table's bytes
per chunk on disk (heap with its free space and visibility maps, TOAST, indexes) and the WAL
written per chunk; then every stream, closed, is pruned as a day's worth would be
(``maintenance.prune``): its time, its WAL and the dead tuples it leaves for vacuum.

It measures and prints; it changes nothing in how chunks are stored.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from django.db import connections
from django.test import override_settings
from django.utils import timezone

from .run import host

ALIAS = "pgstreams_storage"
# Bytes per chunk, and how each is made.
SHAPES = {"tokens": 4, "lines": 100}
WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an they "
    "you were her she there one all we their can has been if more when will would who so no data stream model "
    "token answer query reader writer server page line time user chat text offset chunk value"
).split()

_SIZES_SQL = """
SELECT pg_relation_size(c.oid, 'main') + pg_relation_size(c.oid, 'fsm') + pg_relation_size(c.oid, 'vm'),
       coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0),
       pg_indexes_size(c.oid),
       (SELECT count(*) FROM pgstreams_chunk),
       (SELECT coalesce(sum(octet_length(data)), 0) + coalesce(sum(octet_length(blob)), 0) FROM pgstreams_chunk)
FROM pg_class AS c WHERE c.oid = 'pgstreams_chunk'::regclass
"""
_DEAD_SQL = "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'pgstreams_chunk'"


@dataclass
class StorageConfig:
    chunks: int = 1_000_000  # per shape
    streams: int = 1000
    shapes: tuple[str, ...] = tuple(SHAPES)


def chunk_maker(shape: str, seed: int) -> Callable[[int], str]:
    """The ``i``-th chunk of a stream of ``shape``: a token of English-like text, 4 bytes (a
    word's first letters after a space, as tokenizers cut words), or a log line of 100 bytes."""
    rng = random.Random(seed)
    if shape == "tokens":
        return lambda i: (" " + rng.choice(WORDS))[:4].ljust(4)
    return lambda i: (
        (
            f"2026-12-07T16:{i // 60 % 60:02d}:{i % 60:02d}Z worker-{rng.randrange(8)} INFO "
            f"job {rng.randrange(10**6):06d} {' '.join(rng.choices(WORDS, k=8))}"
        )[:99].ljust(99)
        + "\n"
    )


def run_storage(config: StorageConfig, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Each shape in turn on a fresh scratch server; the report."""
    from pgstreams import appender, notify

    from .scratch import ScratchServer, installed

    rows = []
    postgres = ""
    for shape in config.shapes:
        with ScratchServer() as server, installed({ALIAS: server.database()}, migrate=ALIAS):
            with override_settings(PGSTREAMS={"DATABASE": ALIAS}):
                postgres = _one(ALIAS, "SHOW server_version")
                rows.append(_measure(shape, config, say))
                appender.stop_appenders()  # their connections, and the notifications held, go before the server
                notify.stop_flusher()
            connections[ALIAS].close()
    return {"machine": {**host(), "postgres": postgres}, "config": asdict(config), "storage": rows}


def _one(alias: str, sql: str, params: list[Any] | None = None) -> Any:
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def _wal(alias: str) -> int:
    """Bytes of WAL the server has written since it began."""
    return int(_one(alias, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')"))


def _measure(shape: str, config: StorageConfig, say: Callable[[str], None]) -> dict[str, Any]:
    from pgstreams import maintenance
    from pgstreams.models import Stream

    made = Stream.objects.using(ALIAS).bulk_create(Stream(label="storage") for _ in range(config.streams))
    streams = [str(stream.id) for stream in made]
    per_stream = config.chunks // config.streams
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("CHECKPOINT")  # every page written from here is the run's
    wal = _wal(ALIAS)
    began = time.monotonic()
    asyncio.run(_write(streams, per_stream, shape))
    seconds = time.monotonic() - began
    written_wal = _wal(ALIAS) - wal
    with connections[ALIAS].cursor() as cursor:
        cursor.execute(_SIZES_SQL)
        heap, toast, indexes, chunks, data = cursor.fetchone()
    say(f"storage: {shape}: {chunks:,} chunks of {data / chunks:.0f} bytes written in {seconds:.1f} s")

    wal = _wal(ALIAS)
    began = time.monotonic()
    pruned = maintenance.prune(timezone.now(), using=ALIAS)
    prune_seconds = time.monotonic() - began
    prune_wal = _wal(ALIAS) - wal
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    connections[ALIAS].close()  # its statistics go out as it leaves
    time.sleep(1.0)
    dead = _dead_tuples()
    say(f"storage: {shape}: pruned {pruned.streams:,} streams in {prune_seconds:.1f} s; {dead:,} dead tuples left")
    return {
        "shape": shape,
        "chunks": chunks,
        "data_bytes": data,
        "bytes_per_chunk": {
            "data": round(data / chunks, 1),
            "heap": round(heap / chunks, 1),
            "toast": round(toast / chunks, 1),
            "indexes": round(indexes / chunks, 1),
            "total": round((heap + toast + indexes) / chunks, 1),
        },
        "wal_bytes_per_chunk": round(written_wal / chunks, 1),
        "write_seconds": round(seconds, 2),
        "prune": {
            "streams": pruned.streams,
            "chunks": pruned.chunks,
            "seconds": round(prune_seconds, 2),
            "wal_bytes": prune_wal,
            "dead_tuples": dead,
        },
    }


def _dead_tuples() -> int:
    """The chunk table's dead tuples as the statistics have them (at most 5 s to come in)."""
    deadline = time.monotonic() + 5
    while (dead := _one(ALIAS, _DEAD_SQL)) == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    return int(dead)


async def _write(streams: list[str], per_stream: int, shape: str) -> None:
    """One task per stream, each sending its chunks one at a time, all together, then closing."""
    import pgstreams

    async def one(index: int, sid: str) -> None:
        make = chunk_maker(shape, index)
        async with pgstreams.stream_writer(sid, close=True, using=ALIAS) as writer:
            for i in range(per_stream):
                await writer.send(make(i))
                await asyncio.sleep(0)  # every stream advances a chunk at a time, as tokens do

    await asyncio.gather(*(one(i, sid) for i, sid in enumerate(streams)))


def table(report: dict[str, Any]) -> str:
    """Bytes per chunk by where they lie, WAL per chunk, and the prune's cost, a line per shape."""
    lines = [
        "shape    chunks     data  heap  toast  indexes  total (x data)  WAL   prune: s   WAL MB  dead tuples",
    ]
    for row in report["storage"]:
        b, p = row["bytes_per_chunk"], row["prune"]
        lines.append(
            f"{row['shape']:<8} {row['chunks']:>9,} {b['data']:>5g} {b['heap']:>5g} {b['toast']:>6g} {b['indexes']:>8g}"
            f"  {b['total']:>5g} ({b['total'] / b['data']:.1f}x)  {row['wal_bytes_per_chunk']:>5g}"
            f"  {p['seconds']:>8} {p['wal_bytes'] / 2**20:>8.1f}  {p['dead_tuples']:>11,}"
        )
    return "\n".join(lines)
