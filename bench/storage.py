"""What a chunk costs on disk (``pgstreams_bench --storage``).

For each write shape (``SHAPES``: LLM tokens of 4 bytes, log lines of 100), chunks are written as
that shape's writers write them, ``stream_writer`` in one asyncio task per stream, every stream
advancing a chunk at a time, on a scratch server of the run's own (``bench.scratch``: nothing else
writes there, so its WAL is theirs). Then, beside the data's own bytes: the chunk table's bytes
per chunk on disk (heap with its free space and visibility maps, TOAST, indexes) and the WAL
written per chunk; then every stream, closed, is pruned as a day's worth would be
(``maintenance.prune``): its time, its WAL and the dead tuples it leaves for vacuum. The same
again with the streams compacted first. Then the chunks partitioned by day (``partitions``): a
table of as many chunks converted, and a day made beside them; then streams of a past day written
whole and the day pruned by dropping its partition, at an eighth of the chunks and at all of them
(the same number of streams), to show what its time follows.

It measures and prints; it changes nothing in how chunks are stored.
"""

from __future__ import annotations

import asyncio
import random
import string
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
TOKENS_PER_SECOND = 20  # per stream, as the LLM benchmark's default
WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an they "
    "you were her she there one all we their can has been if more when will would who so no data stream model "
    "token answer query reader writer server page line time user chat text offset chunk value"
).split()

_SIZES_SQL = """
SELECT pg_relation_size(c.oid, 'main') + pg_relation_size(c.oid, 'fsm') + pg_relation_size(c.oid, 'vm'),
       coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0),
       pg_indexes_size(c.oid),
       (SELECT coalesce(sum(next_offset), 0) FROM pgstreams_stream WHERE deleted_at IS NULL),
       (SELECT coalesce(sum(octet_length(data)), 0) + coalesce(sum(octet_length(blob)), 0) FROM pgstreams_chunk)
FROM pg_class AS c WHERE c.oid = 'pgstreams_chunk'::regclass
"""
# The chunk table's, or its partitions' (a partitioned table has no rows of its own).
_DEAD_SQL = "SELECT sum(n_dead_tup) FROM pg_stat_user_tables WHERE relname LIKE 'pgstreams\\_chunk%'"


@dataclass
class StorageConfig:
    chunks: int = 1_000_000  # per shape
    streams: int = 1000
    shapes: tuple[str, ...] = tuple(SHAPES)


def chunk_maker(shape: str, seed: int) -> Callable[[int], str]:
    """The ``i``-th chunk of a stream of ``shape``: a token of 4 bytes, a space and three letters
    drawn at random (17,576 tokens, each as likely: text that compresses worse than a model's),
    or a log line of 100 bytes (a timestamp, a worker, a job, words)."""
    rng = random.Random(seed)
    if shape == "tokens":
        return lambda i: " " + "".join(rng.choices(string.ascii_lowercase, k=3))
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
    """The shape written, measured and pruned; then written again, compacted, measured, pruned."""
    plain = _write_and_size(shape, config, say)
    plain["prune"] = _prune(shape, say)
    _vacuum_full()
    compacted = _write_and_size(shape, config, say)
    compacted["compaction"] = _compact(shape, say)
    compacted["bytes_per_chunk"] = _sizes()
    compacted["prune"] = _prune(shape, say)
    _vacuum_full()
    conversion = _conversion(shape, config, say)
    by_day = [_by_day(shape, config, say, share) for share in (8, 1)]
    return {
        "shape": shape,
        "chunks": plain["chunks"],
        "plain": plain,
        "compacted": compacted,
        "conversion": conversion,
        "by_day": by_day,
    }


def _conversion(shape: str, config: StorageConfig, say: Callable[[str], None]) -> dict[str, Any]:
    """A table of ``config.chunks`` chunks of the shape's size (made by one INSERT: what the
    conversion costs follows their rows and pages, not how they were written) partitioned by day
    (``partitions.convert``): its time under the table's lock; then the time of making a day
    while they are the default partition, and once they are gone."""
    import datetime

    from pgstreams import partitions

    per_stream = config.chunks // config.streams
    with connections[ALIAS].cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgstreams_stream (id, label, content_type, next_offset, closed_at, created_at, metadata)"
            " SELECT gen_random_uuid(), 'storage', 'text/plain', %s, now(), now(), '{}'::jsonb"
            " FROM generate_series(1, %s)",
            [per_stream, config.streams],
        )
        cursor.execute(
            'INSERT INTO pgstreams_chunk (stream_id, "offset", data, created_at)'
            " SELECT s.id, o, repeat('x', %s), now() FROM pgstreams_stream AS s, generate_series(0, %s - 1) AS o",
            [SHAPES[shape], per_stream],
        )
        cursor.execute("VACUUM ANALYZE pgstreams_chunk")
    timed = {}
    for what, step in (
        ("convert", lambda: partitions.convert(0, using=ALIAS, today=datetime.date(2025, 12, 1))),
        ("make_day", lambda: partitions.ensure(0, using=ALIAS, today=datetime.date(2025, 12, 2))),
    ):
        began = time.monotonic()
        step()
        timed[what] = round(time.monotonic() - began, 3)
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("TRUNCATE pgstreams_stream CASCADE")  # and the chunks, by the trigger
    began = time.monotonic()
    partitions.ensure(0, using=ALIAS, today=datetime.date(2025, 12, 3))
    timed["make_day_empty"] = round(time.monotonic() - began, 3)
    say(
        f"storage: {shape}: {config.chunks:,} chunks converted in {timed['convert']} s; a day made in "
        f"{timed['make_day']} s beside them, {timed['make_day_empty']} s without"
    )
    return {"chunks": config.chunks, "seconds": timed}


def _by_day(shape: str, config: StorageConfig, say: Callable[[str], None], share: int) -> dict[str, Any]:
    """``1/share`` of the chunks written to streams of a past day, in its partition of a table
    partitioned by day, then pruned: the day dropped, its streams' rows deleted."""
    import datetime

    from pgstreams import partitions

    day = datetime.date(2026, 1, share)  # a day of its own for each run, long over
    partitions.ensure(0, using=ALIAS, today=day)
    start = partitions.bound(day).int >> 80
    ids = [partitions.uuid7(start + n) for n in range(config.streams)]
    chunks = config.chunks // share
    written = _write_and_size(shape, StorageConfig(chunks, config.streams), say, ids=ids, sized=False)
    pruned = _prune(shape, say)
    assert partitions.name(day) not in [table for _, table in partitions.days(ALIAS)], "the day was not dropped"
    return {"chunks": chunks, "wal_bytes_per_chunk": written["wal_bytes_per_chunk"], "prune": pruned}


def _write_and_size(
    shape: str, config: StorageConfig, say: Callable[[str], None], ids: list[Any] | None = None, sized: bool = True
) -> dict[str, Any]:
    """Streams of ``shape`` (with ``ids``, or new ones) written whole and closed: what they cost
    in WAL and, ``sized``, on disk."""
    from pgstreams.models import Stream

    made = Stream.objects.using(ALIAS).bulk_create(
        Stream(label="storage", **({"id": ids[n]} if ids else {})) for n in range(config.streams)
    )
    streams = [str(stream.id) for stream in made]
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("CHECKPOINT")  # every page written from here is the run's
    wal = _wal(ALIAS)
    began = time.monotonic()
    asyncio.run(_write(streams, config.chunks // config.streams, shape))
    seconds = time.monotonic() - began
    written_wal = _wal(ALIAS) - wal
    say(f"storage: {shape}: {config.chunks:,} chunks written in {seconds:.1f} s")
    if not sized:
        return {"wal_bytes_per_chunk": round(written_wal / config.chunks, 1), "write_seconds": round(seconds, 2)}
    sizes = _sizes()
    return {
        "chunks": sizes.pop("chunks"),
        "bytes_per_chunk": sizes,
        "wal_bytes_per_chunk": round(written_wal / config.chunks, 1),
        "write_seconds": round(seconds, 2),
    }


def _sizes() -> dict[str, Any]:
    """The chunk table's bytes on disk per chunk, by where they lie, and the data's own."""
    with connections[ALIAS].cursor() as cursor:
        cursor.execute(_SIZES_SQL)
        heap, toast, indexes, chunks, data = map(int, cursor.fetchone())
    return {
        "chunks": int(chunks),
        "data": round(data / chunks, 1),
        "heap": round(heap / chunks, 1),
        "toast": round(toast / chunks, 1),
        "indexes": round(indexes / chunks, 1),
        "total": round((heap + toast + indexes) / chunks, 1),
    }


def _compact(shape: str, say: Callable[[str], None]) -> dict[str, Any]:
    """Every stream compacted (``maintenance.compact``), then the table rewritten (VACUUM FULL),
    so that what it holds is what the runs take, as the space the compaction freed is reused by
    later writes: the compaction's time and WAL."""
    from pgstreams import maintenance

    with connections[ALIAS].cursor() as cursor:  # closed an hour ago: past compaction's grace
        cursor.execute("UPDATE pgstreams_stream SET closed_at = closed_at - interval '1 hour'")
    wal = _wal(ALIAS)
    began = time.monotonic()
    done = maintenance.compact(timezone.now(), using=ALIAS)
    seconds = time.monotonic() - began
    compaction_wal = _wal(ALIAS) - wal
    _vacuum_full()
    say(f"storage: {shape}: compacted {done.chunks:,} chunks into {done.runs:,} runs in {seconds:.1f} s")
    return {"seconds": round(seconds, 2), "wal_bytes": compaction_wal, "runs": done.runs}


def _prune(shape: str, say: Callable[[str], None]) -> dict[str, Any]:
    """Every stream pruned: the time, the WAL, and the dead tuples it left for vacuum."""
    from pgstreams import maintenance

    dead = _dead_tuples()
    wal = _wal(ALIAS)
    began = time.monotonic()
    pruned = maintenance.prune(timezone.now(), using=ALIAS)
    seconds = time.monotonic() - began
    prune_wal = _wal(ALIAS) - wal
    dead = _dead_tuples() - dead  # a dropped partition's count goes with it: it had none
    say(f"storage: {shape}: pruned {pruned.streams:,} streams in {seconds:.1f} s; {dead:,} dead tuples left")
    return {
        "streams": pruned.streams,
        "chunks": pruned.chunks,
        "seconds": round(seconds, 2),
        "wal_bytes": prune_wal,
        "dead_tuples": dead,
    }


def _vacuum_full() -> None:
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("VACUUM FULL pgstreams_chunk")


def _dead_tuples() -> int:
    """The chunk table's dead tuples, as the statistics have them once this process's counts,
    sent as its connection closes, are in."""
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    connections[ALIAS].close()
    time.sleep(1.0)
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(_DEAD_SQL)
        return int(cursor.fetchone()[0])


async def _write(streams: list[str], per_stream: int, shape: str) -> None:
    """One task per stream, each sending its chunks one at a time, all together, then closing:
    tokens at a model's pace (each its own commit time, as in a chat), lines as fast as they go."""
    import pgstreams

    pause = 1 / TOKENS_PER_SECOND if shape == "tokens" else 0.0

    async def one(index: int, sid: str) -> None:
        make = chunk_maker(shape, index)
        await asyncio.sleep(random.random() * pause)
        async with pgstreams.stream_writer(sid, close=True, using=ALIAS) as writer:
            for i in range(per_stream):
                await writer.send(make(i))
                await asyncio.sleep(pause)  # every stream advances a chunk at a time

    await asyncio.gather(*(one(i, sid) for i, sid in enumerate(streams)))


def table(report: dict[str, Any]) -> str:
    """Bytes per chunk by where they lie, WAL per chunk, compaction's and the prune's costs: a line
    per shape, plain and compacted."""
    lines = [
        "shape    stored      chunks  data  heap  toast  indexes  total (x data)  WAL/chunk  "
        "compact s  prune s  prune WAL MB  dead tuples",
    ]
    for row in report["storage"]:
        for stored in ("plain", "compacted"):
            r = row[stored]
            b, p, c = r["bytes_per_chunk"], r["prune"], r.get("compaction")
            lines.append(
                f"{row['shape']:<8} {stored:<9} {r['chunks']:>9,} {b['data']:>5g} {b['heap']:>5g} {b['toast']:>6g}"
                f" {b['indexes']:>8g}  {b['total']:>5g} ({b['total'] / b['data']:.1f}x)  {r['wal_bytes_per_chunk']:>9g}"
                f"  {c['seconds'] if c else '-':>9} {p['seconds']:>8} {p['wal_bytes'] / 2**20:>13.1f}"
                f"  {p['dead_tuples']:>11,}"
            )
        if conversion := row.get("conversion"):
            t = conversion["seconds"]
            lines.append(
                f"{row['shape']:<8} converted {conversion['chunks']:>9,}: {t['convert']} s under the table's lock;"
                f" a day made {t['make_day']} s beside them, {t['make_day_empty']} s once they are gone"
            )
        for r in row.get("by_day", []):
            p = r["prune"]
            lines.append(
                f"{row['shape']:<8} {'by day':<9} {r['chunks']:>9,} {'(as plain)':>40}  {r['wal_bytes_per_chunk']:>9g}"
                f"  {'-':>9} {p['seconds']:>8} {p['wal_bytes'] / 2**20:>13.1f}  {p['dead_tuples']:>11,}"
            )
    return "\n".join(lines)
