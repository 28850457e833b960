"""Maintenance of stored streams: pruning closed ones in batches, removing those whose Durable
Streams expiry has passed, and the figures of ``pgstreams_stats``. The management commands are
thin wrappers over these functions.

Pruning never touches an open stream, and each batch is one transaction, as short as the
project's delete receivers let it be (they run in it, with no idle bound): a stream's
``next_offset`` is its number of chunks, so batches are sized without counting rows, and a stream
larger than a batch has its chunks deleted in offset slices before its row goes, each once Django
would delete it. Streams go as Django deletes them (``durable.store.delete_streams``): a stream
that forks were made of is kept as a tombstone that holds its path, as a Durable Streams DELETE
keeps it, until its last fork goes.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction
from django.utils import timezone

from . import conf, db

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
    Returns what was deleted.

    Raises:
        ProtectedError, RestrictedError: objects of the project keep a stream (on_delete
            PROTECT, RESTRICT): it is left whole, and what was pruned before stays pruned.
    """
    from .durable.store import delete_streams, remove_orphan_tombstones  # not at import: models load later

    if batch < 1:
        raise ValueError("batch must be at least 1")
    alias = using or conf.database()
    done = Pruned()
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
        # No idle bound: Django's delete runs the project's signal receivers, which take the time
        # they take, as in any delete of the project's.
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            cursor.execute(_LOCK_SQL, [group, cutoff])
            locked = dict(cursor.fetchall())  # id: chunks
            delete_streams(alias, list(locked))
        done.streams += len(locked)
        done.chunks += sum(locked.values())
        if progress:
            progress(done)
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


def stats(using: str | None = None) -> dict[str, Any]:
    """Streams open and closed, chunks, table and index sizes, the notification queue, settings."""
    alias = using or conf.database()
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE closed_at IS NULL), count(*) FILTER (WHERE closed_at IS NOT NULL),"
            " coalesce(sum(next_offset), 0) FROM pgstreams_stream"
        )
        open_streams, closed_streams, chunks = cursor.fetchone()
        sizes = {}
        for table in ("pgstreams_stream", "pgstreams_chunk"):
            cursor.execute("SELECT pg_table_size(%s::regclass), pg_indexes_size(%s::regclass)", [table, table])
            table_bytes, index_bytes = cursor.fetchone()
            sizes[table] = {"table_bytes": table_bytes, "index_bytes": index_bytes}
        cursor.execute("SELECT pg_notification_queue_usage()")
        queue = cursor.fetchone()[0]
    return {
        "database": alias,
        "streams_open": open_streams,
        "streams_closed": closed_streams,
        "chunks": int(chunks),
        "sizes": sizes,
        "notification_queue_usage": queue,
        "settings": {name: setting.raw() for name, setting in conf.SETTINGS.items()},
    }
