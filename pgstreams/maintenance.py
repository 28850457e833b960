"""Maintenance of stored streams: pruning closed ones in batches, removing those whose Durable
Streams expiry has passed, compacting closed ones (their chunks folded into runs, ``runs.py``),
and the figures of ``pgstreams_stats``. The management commands are thin wrappers over these
functions.

Pruning never touches an open stream, and each batch is one transaction, as short as the
project's delete receivers let it be (they run in it, with no idle bound): a stream's
``next_offset`` is its number of chunks, so batches are sized without counting rows, and a stream
larger than a batch has its chunks deleted in offset slices before its row goes, each once Django
would delete it; with the chunks partitioned by day (``partitions``), a day whose every stream
may go has its streams deleted but for their chunks, then its partition dropped, in a moment.
Streams go as Django deletes them (``durable.store.delete_streams``): a stream that forks were
made of is kept as a tombstone that holds its path, as a Durable Streams DELETE keeps it, until
its last fork goes.
"""

from __future__ import annotations

import contextlib
import datetime
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

from django.db import connections, transaction
from django.utils import timezone

from . import conf, db, metrics, partitions, runs

_AGE = re.compile(r"(\d+)\s*([smhdw])\Z")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_cutoff(value: str, now: datetime.datetime | None = None) -> datetime.datetime:
    """``7d``, ``12h``, ``30m``, ``2w``, ``45s`` ago, or an ISO 8601 date or datetime; in UTC.

    Raises:
        ValueError: neither, an age that reaches back before the year 1 (saying the largest
            one accepted), or a date outside the years 1 to 9999 in UTC (PostgreSQL refuses a
            UTC offset of 16 hours or more, so the cutoff is sent in UTC).
    """
    now = now or timezone.now()
    text = value.strip()
    shown = repr(text if len(text) <= 40 else f"{text[:40]}...")
    if found := _AGE.match(text):
        unit = found.group(2)
        largest = int((now - datetime.datetime.min.replace(tzinfo=datetime.UTC)).total_seconds()) // _UNIT_SECONDS[unit]
        # A count of more digits than int() reads, or one past the year 1: the same answer.
        if len(found.group(1)) > len(str(largest)) or int(found.group(1)) > largest:
            raise ValueError(
                f"{shown} reaches back before the year 1: the largest age accepted is {largest}{unit}; "
                "give a smaller age or an ISO date"
            )
        return now - datetime.timedelta(**{_UNITS[unit]: int(found.group(1))})
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{shown} is neither an age like 7d, 12h, 30m, 2w nor an ISO date") from None
    try:
        return (moment if timezone.is_aware(moment) else timezone.make_aware(moment, datetime.UTC)).astimezone(
            datetime.UTC
        )
    except OverflowError:
        raise ValueError(f"{shown} falls outside the years 1 to 9999 in UTC") from None


# The oldest closed streams first, read from the partial index on (closed_at, id).
CANDIDATES_SQL = (
    "SELECT id, next_offset FROM pgstreams_stream WHERE closed_at IS NOT NULL AND closed_at < %s"
    " AND deleted_at IS NULL"
    " ORDER BY closed_at, id LIMIT %s"
)


# Still closed (a stream is never reopened), still old and not a tombstone, locked as
# ``durable.store.LOCK_FOR_DELETE_SQL`` locks: no row that points at them is added until the
# transaction ends, and a fork of one is made under its source's row lock, so every fork there is
# is seen.
_LOCK_SQL = (
    "SELECT id, next_offset FROM pgstreams_stream WHERE id = ANY(%s) AND closed_at < %s AND deleted_at IS NULL"
    " ORDER BY id FOR UPDATE"
)


@dataclass
class Pruned:
    streams: int = 0
    chunks: int = 0


def prunable(cutoff: datetime.datetime, using: str | None = None) -> Pruned:
    """How many closed streams (and chunks) closed before ``cutoff`` would be deleted."""
    with connections[using or conf.database()].cursor() as cursor:
        cursor.execute(
            "SELECT count(*), coalesce(sum(next_offset), 0) FROM pgstreams_stream"
            " WHERE closed_at IS NOT NULL AND closed_at < %s AND deleted_at IS NULL",
            [cutoff],
        )
        streams, chunks = cursor.fetchone()
    return Pruned(streams, int(chunks))


def prune(
    cutoff: datetime.datetime,
    *,
    batch: int = 10_000,
    using: str | None = None,
    progress: Callable[[Pruned], None] | None = None,
) -> Pruned:
    """Delete the streams closed before ``cutoff`` with their chunks, at most ``batch`` chunks
    per transaction; open streams and tombstones (deleted streams whose forks remain) are never
    touched. A stream forks were made of leaves a tombstone, as a Durable Streams DELETE does, and
    tombstones whose forks are all gone go at the end, if Django would delete them. The
    project's objects that point at a stream go with it, or keep it, as their ``on_delete`` says.
    With the chunks partitioned by day (``partitions``), each day whose every stream may go goes
    first: its streams 1,000 at a time, as above but for their chunks, then its partition with
    them; the other streams go as before, as all do when called in a transaction (the drop's lock
    of the table would last to its end). Returns what was deleted.

    Raises:
        ProtectedError, RestrictedError: objects of the project keep a stream (on_delete
            PROTECT, RESTRICT): it is left whole, and what was pruned before stays pruned.
        OperationalError: the chunk table's lock was not had to drop a day (``partitions.busy``):
            its streams are gone, its chunks go with it at the next prune.
    """
    from .durable.store import delete_streams, remove_orphan_tombstones  # not at import: models load later

    if batch < 1:
        raise ValueError("batch must be at least 1")
    alias = using or conf.database()
    done = Pruned()

    def delete(group: list[Any], day: datetime.date | None = None) -> None:
        # No idle bound: Django's delete runs the project's signal receivers, which take the time
        # they take, as in any delete of the project's.
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            with partitions.dropping_day(cursor, day) if day else contextlib.nullcontext():
                cursor.execute(_LOCK_SQL, [group, cutoff])
                locked = dict(cursor.fetchall())  # id: chunks
                delete_streams(alias, list(locked))
        done.streams += len(locked)
        done.chunks += sum(locked.values())
        if progress:
            progress(done)

    # Whole days first: their streams deleted as below but for their chunks, then the day dropped.
    # Not in a caller's transaction, which would hold the drop's lock of the table to its end.
    if partitions.is_partitioned(alias) and not connections[alias].in_atomic_block:
        days = partitions.droppable(cutoff, alias)
        for day, _ in partitions.days(alias, marked=True):  # a prune's left by a stop, or a stream made since
            if day not in days:
                partitions.remove_orphans(day, alias)
        for day in days:
            if not partitions.mark_dropping(day, alias):
                continue  # another prune dropped it meanwhile
            ids = partitions.streams_of(day, alias)
            try:
                for start in range(0, len(ids), 1000):
                    delete(ids[start : start + 1000], day)
            except Exception:
                partitions.remove_orphans(day, alias)  # the day is kept: what went goes as before
                raise
            if not partitions.drop(day, alias):
                partitions.remove_orphans(day, alias)
    while True:
        with connections[alias].cursor() as cursor:
            cursor.execute(CANDIDATES_SQL, [cutoff, max(1, min(batch, 1000))])
            candidates = cursor.fetchall()
        if not candidates:
            break
        group, size = [], 0
        for stream_id, count in candidates:
            if group and size + count > batch:
                break
            group.append(stream_id)
            size += count
        if size > batch:  # one stream larger than a batch: its chunks go in slices first
            _delete_chunks_in_slices(alias, group[0], cutoff, size, batch)
        delete(group)
    # Tombstones whose last fork this prune took (or an earlier one) go too.
    remove_orphan_tombstones(alias)
    return done


def expired(using: str | None = None) -> int:
    """How many streams' Durable Streams expiry has passed."""
    from .durable.store import EXPIRED_WHERE

    with connections[using or conf.database()].cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM pgstreams_stream WHERE {EXPIRED_WHERE}")  # constants
        return int(cursor.fetchone()[0])


def prune_expired(*, using: str | None = None, batch: int = 100) -> int:
    """Remove every stream whose Durable Streams expiry (TTL or Expires-At) has passed, ``batch``
    streams at a time, then the tombstones whose forks are all gone; returns how many streams
    expired. Requests remove expired streams too, when they meet them."""
    from .durable.store import remove_expired, remove_orphan_tombstones  # not at import: models load later

    alias = using or conf.database()
    removed = 0
    while (done := remove_expired(alias, batch)) > 0:
        removed += done
    remove_orphan_tombstones(alias)
    return removed


def _delete_chunks_in_slices(alias: str, stream_id: Any, cutoff: datetime.datetime, count: int, batch: int) -> None:
    """Delete a stream's chunks ``batch`` at a time, each slice in a transaction of its own under
    the stream's row lock, once Django would delete the stream; its row goes in prune's batch.

    The lock keeps rows that would point at the stream from being added during a slice, not
    between slices: an object of the project made to keep the stream while its chunks go stops
    the prune at the next slice (or at the row's delete) with the slices before gone.

    Raises:
        ProtectedError, RestrictedError: objects of the project keep the stream.
    """
    from .durable.store import check_deletable  # not at import: models load later

    for start in range(0, count, batch):
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            # Only our SQL and Django's look at what points at the stream (it sends no signal).
            db.bound_idle(alias, cursor)  # a stopped pruner holds this row no longer
            cursor.execute(_LOCK_SQL, [[stream_id], cutoff])
            if cursor.fetchone() is None:
                return  # gone, or a tombstone, meanwhile
            check_deletable(alias, [stream_id])
            cursor.execute(
                'DELETE FROM pgstreams_chunk WHERE stream_id = %s AND "offset" >= %s AND "offset" < %s',
                [stream_id, start, start + batch],
            )


# A run holds at most this many chunks and, past its first chunk, this many bytes of data: a read
# that starts inside one unpacks all of it.
RUN_CHUNKS: Final = 4096
RUN_BYTES: Final = 64 << 10

# The oldest closed streams not compacted yet, from the partial index on closed_at. A stream
# closed within the grace (twice CONNECT_TIMEOUT + QUERY_TIMEOUT) is left alone: a writer whose
# commit went unanswered judges it by its rows and the stream's row (resolution.py), and a task
# taking a generation reads its chunks as they were (generations.py), in that time.
_COMPACTABLE_SQL = (
    "SELECT id FROM pgstreams_stream WHERE closed_at IS NOT NULL AND compacted_at IS NULL"
    " AND closed_at < least(%s, now() - make_interval(secs => %s)) AND deleted_at IS NULL"
    " ORDER BY closed_at LIMIT %s"
)
# Locked as a writer's append locks it (a prune or a delete waits for the slice, and the slice
# for them), then still there and closed.
_COMPACT_LOCK_SQL = (
    "SELECT id FROM pgstreams_stream WHERE id = %s AND closed_at IS NOT NULL AND deleted_at IS NULL FOR NO KEY UPDATE"
)
_PLAIN_SQL = (
    'SELECT "offset", data, blob, created_at FROM pgstreams_chunk'
    ' WHERE stream_id = %s AND "offset" > %s AND run IS NULL ORDER BY "offset" LIMIT %s'
)
_FOLD_SQL = 'DELETE FROM pgstreams_chunk WHERE stream_id = %s AND "offset" BETWEEN %s AND %s AND run IS NULL'
_RUN_SQL = (
    'INSERT INTO pgstreams_chunk (stream_id, "offset", data, blob, created_at, run) VALUES (%s, %s, %s, %s, %s, %s)'
)


def compactable(cutoff: datetime.datetime, using: str | None = None) -> tuple[int, int]:
    """How many streams closed before ``cutoff`` are not compacted yet, and their chunks."""
    with connections[using or conf.database()].cursor() as cursor:
        cursor.execute(
            "SELECT count(*), coalesce(sum(next_offset), 0) FROM pgstreams_stream WHERE closed_at IS NOT NULL"
            " AND compacted_at IS NULL AND closed_at < %s AND deleted_at IS NULL",
            [cutoff],
        )
        streams, chunks = cursor.fetchone()
    return int(streams), int(chunks)


@dataclass
class Compacted:
    streams: int = 0  # streams compacted whole
    chunks: int = 0  # chunks folded into runs
    runs: int = 0  # rows they became


def compact(
    cutoff: datetime.datetime,
    *,
    batch: int = 10_000,
    using: str | None = None,
    progress: Callable[[Compacted], None] | None = None,
    grace: float | None = None,
) -> Compacted:
    """Fold the chunks of the streams closed before ``cutoff`` into runs (``runs.py``), the oldest
    streams first, at most ``batch`` chunks per transaction (a run holds no more: a batch under
    RUN_CHUNKS makes shorter runs, and a stream is compacted once); a stream closed within the last
    ``grace`` seconds (by default ``2 x (CONNECT_TIMEOUT + QUERY_TIMEOUT)``: a writer whose
    commit went unanswered judges it meanwhile) waits for the next pass. Every read answers the
    same before and after, and during: each slice is one transaction, so a reader's snapshot
    sees a chunk either in its row or in its run, never both or neither. Returns what was done.
    """
    if batch < 1:
        raise ValueError("batch must be at least 1")
    alias = using or conf.database()
    if grace is None:
        grace = 2 * (conf.connect_timeout() + conf.query_timeout())
    done = Compacted()
    while True:
        with connections[alias].cursor() as cursor:
            cursor.execute(_COMPACTABLE_SQL, [cutoff, grace, 100])
            streams = [row[0] for row in cursor.fetchall()]
        if not streams:
            return done
        for stream_id in streams:
            after: int | None = -1
            while after is not None:
                after = _compact_slice(alias, stream_id, after, batch, done)
                if progress:
                    progress(done)


def _compact_slice(alias: str, stream_id: Any, after: int, batch: int, done: Compacted) -> int | None:
    """One transaction: up to ``batch`` of a stream's chunks past ``after`` still in rows of
    their own become runs, counted into ``done``; returns the offset the next slice starts
    after, or None once the stream is compacted (its last slice marks it) or gone meanwhile."""
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        db.bound_idle(alias, cursor)  # a stopped compaction holds this row no longer
        cursor.execute(_COMPACT_LOCK_SQL, [stream_id])
        if cursor.fetchone() is None:
            return None
        cursor.execute(_PLAIN_SQL, [stream_id, after, batch + 1])
        rows = cursor.fetchall()
        last = len(rows) <= batch  # the slice reaches the stream's end
        folds = _folds(rows[:batch], whole=last)
        for fold in folds:
            if len(fold) == 1:
                continue  # a run of one would cost more than its row
            text = fold[0][1] is not None
            value, index, created_at = runs.pack([r[1] if text else r[2] for r in fold], [r[3] for r in fold])
            cursor.execute(_FOLD_SQL, [stream_id, fold[0][0], fold[-1][0]])
            values = (value, None) if text else (None, value)
            cursor.execute(_RUN_SQL, [stream_id, fold[-1][0], *values, created_at, index])
            done.chunks += len(fold)
            done.runs += 1
            transaction.on_commit(partial(metrics.chunks_compacted.inc, len(fold)), using=alias)
        if not last:
            return folds[-1][-1][0]
        cursor.execute("UPDATE pgstreams_stream SET compacted_at = now() WHERE id = %s", [stream_id])
        done.streams += 1
        return None


def _folds(rows: list[tuple[Any, ...]], *, whole: bool) -> list[list[tuple[Any, ...]]]:
    """``rows`` (offset, data, blob, created_at) cut into runs: consecutive offsets, one kind of
    value, at most RUN_CHUNKS chunks and RUN_BYTES bytes past the first. Unless ``whole`` (the
    rows reach the stream's end), the last run, which the next slice may make longer, waits."""
    folds: list[list[tuple[Any, ...]]] = []
    size = 0
    for row in rows:
        value = row[1] if row[1] is not None else row[2]
        length = runs.octets(value)
        current = folds[-1] if folds else None
        if (
            current is None
            or row[0] != current[-1][0] + 1
            or (row[1] is None) != (current[0][1] is None)
            or len(current) >= RUN_CHUNKS
            or size + length > RUN_BYTES
        ):
            folds.append([row])
            size = length
        else:
            current.append(row)
            size += length
    if not whole and len(folds) > 1:
        folds.pop()
    return folds


def stats(using: str | None = None) -> dict[str, Any]:
    """Streams open and closed, chunks, table and index sizes, the days held when the chunks are
    partitioned by day, the notification queue, settings."""
    alias = using or conf.database()
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE closed_at IS NULL), count(*) FILTER (WHERE closed_at IS NOT NULL),"
            " coalesce(sum(next_offset), 0) FROM pgstreams_stream"
        )
        open_streams, closed_streams, chunks = cursor.fetchone()
        sizes = {}
        for table in ("pgstreams_stream", "pgstreams_chunk"):
            cursor.execute(  # a partitioned table's own size is none: its partitions' are summed
                "SELECT sum(pg_table_size(relid))::bigint, sum(pg_indexes_size(relid))::bigint"
                " FROM (SELECT %s::regclass AS relid UNION SELECT relid FROM pg_partition_tree(%s::regclass)) AS t",
                [table, table],
            )
            table_bytes, index_bytes = cursor.fetchone()
            sizes[table] = {"table_bytes": table_bytes, "index_bytes": index_bytes}
        cursor.execute("SELECT pg_notification_queue_usage()")
        queue = cursor.fetchone()[0]
    held = partitions.days(alias) if partitions.is_partitioned(alias) else None
    return {
        "database": alias,
        "streams_open": open_streams,
        "streams_closed": closed_streams,
        "chunks": int(chunks),
        "sizes": sizes,
        # Chunks partitioned by day: the days held, from the first to the last.
        "days": None if held is None else {"count": len(held), "first": held[0][0], "last": held[-1][0]},
        "notification_queue_usage": queue,
        "settings": {name: setting.raw() for name, setting in conf.SETTINGS.items()},
    }
