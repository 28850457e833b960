"""Chunks partitioned by the day their stream was made, so that expiring a day drops a table: no
chunk is deleted row by row, no dead tuple is left, and the time does not grow with the day's rows.

``pgstreams_chunk`` becomes a table partitioned by range of ``stream_id``. With ``DAY_PARTITIONS``
on, a stream's id is a version 7 UUID (RFC 9562), which begins with its creation time in
milliseconds, so the streams made on one UTC day have ids in one range and their chunks fall in
one partition. The primary key ``(stream_id, offset)`` holds the partition key as it is: no query
changes, and a read keyed by stream reads one partition.

``convert()`` turns an existing table into the parent of partitions without copying it: the table
becomes the default partition, whole, where the streams made before (random, version 4 ids) stay
until they are pruned row by row as before. ``ensure()`` makes the days ahead. ``droppable()``,
``dropping_day()`` (its streams' deletes leave their chunks), ``drop()`` and, when the day is
kept after all, ``remove_orphans()`` are how ``maintenance.prune`` expires a day whose every
stream it may delete. Every change of the partitions takes the table's lock first (``locked``).

Not here: which streams may go and deleting their rows (``maintenance.prune`` decides, and
deletes them as Django would); when to make days (``pgstreams_partition``, scheduled by the
project).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Final, TypeVar

from django.db import OperationalError, ProgrammingError, connections, transaction

from . import conf

T = TypeVar("T")

TABLE: Final = "pgstreams_chunk"
DEFAULT: Final = "pgstreams_chunk_default"
# The default partition's check that it holds no row of the days last made: with it, making a
# day's partition needs no scan of the default partition under the parent's lock.
_OUTSIDE: Final = "pgstreams_chunk_default_outside"
_DAY: Final = datetime.timedelta(days=1)
# A day whose streams a prune began to delete, leaving their chunks: its partition's comment.
_DROPPING: Final = "pgstreams: its streams are being deleted, their chunks left for its drop"
# How long a change of the partitions waits for the chunk table's lock at a time, how many times,
# and how long apart (``locked``): readers and writers queued behind it wait at most that long.
LOCK_TIMEOUT: Final = "500ms"
LOCK_TRIES: Final = 10
LOCK_PAUSE: Final = 1.0
# Migration 0004's estimate of a stream's chunks (a twentieth of the rows), which each partition
# needs for itself: a partition analyzed while few streams held it would otherwise be scanned whole.
_N_DISTINCT: Final = -0.05


def uuid7(ms: int | None = None) -> uuid.UUID:
    """A version 7 UUID (RFC 9562): 48 bits of Unix time in milliseconds (now, or ``ms``), then
    74 random bits."""
    ms = time.time_ns() // 1_000_000 if ms is None else ms
    value = (ms & ((1 << 48) - 1)) << 80 | int.from_bytes(os.urandom(10), "big")
    value = (value & ~(0xF << 76)) | 0x7 << 76  # version 7
    value = (value & ~(0x3 << 62)) | 0x2 << 62  # variant 10
    return uuid.UUID(int=value)


def new_stream_id() -> uuid.UUID:
    """A new stream's id (``Stream.id``'s default): time-ordered with ``DAY_PARTITIONS``, else
    random (version 4)."""
    return uuid7() if conf.day_partitions() else uuid.uuid4()


def bound(day: datetime.date) -> uuid.UUID:
    """The smallest version 7 id of a stream made at the start of ``day`` (UTC)."""
    start = datetime.datetime(day.year, day.month, day.day, tzinfo=datetime.UTC)
    return uuid.UUID(int=int(start.timestamp() * 1000) << 80)


def name(day: datetime.date) -> str:
    """The partition of ``day``."""
    return f"{TABLE}_{day:%Y%m%d}"


def is_partitioned(using: str | None = None) -> bool:
    with connections[using or conf.database()].cursor() as cursor:
        cursor.execute("SELECT relkind = 'p' FROM pg_class WHERE oid = %s::regclass", [TABLE])
        return bool(cursor.fetchone()[0])


def busy(exc: BaseException) -> bool:
    """Whether ``exc`` (an OperationalError) is the table's lock not had (``locked``)."""
    return getattr(exc.__cause__, "sqlstate", None) == "55P03"  # lock_not_available


def busy_text() -> str:
    """What ``busy`` means, for an error message."""
    return (
        f"{TABLE}'s lock was not had in {LOCK_TRIES} tries of {LOCK_TIMEOUT} (a long transaction on the chunks "
        "holds it, or waits for it)"
    )


def locked(alias: str, work: Callable[[Any], T]) -> T:
    """``work(cursor)`` in a transaction that holds the chunk table's exclusive lock (all its
    partitions with it), as every change of its partitions here takes it: first, so that two
    never deadlock. Once queued, the lock holds up every read and write of the chunks, so it is
    waited for ``LOCK_TIMEOUT`` at a time, ``LOCK_TRIES`` times, a moment apart.

    Raises:
        OperationalError: the lock was not had (``busy``); nothing changed.
        RuntimeError: called in a transaction (``transaction.atomic``), which would hold the lock
            until it ends.
    """
    if connections[alias].in_atomic_block:
        raise RuntimeError(
            f"changing the partitions of {TABLE} takes its lock, which a transaction would hold until it ends: "
            "call it outside transaction.atomic()"
        )
    for attempt in range(LOCK_TRIES):
        try:
            with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                cursor.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
                return work(cursor)
        except OperationalError as exc:
            if not busy(exc) or attempt == LOCK_TRIES - 1:
                raise
        time.sleep(LOCK_PAUSE)
    raise AssertionError("unreachable")


def _at(day: datetime.date) -> str:
    """``bound(day)`` as a literal (an id computed here: hex digits and dashes), since DDL takes
    no parameters."""
    return f"'{bound(day)}'::uuid"


def convert(ahead: int = 7, *, using: str | None = None, today: datetime.date | None = None) -> list[str]:
    """Make ``pgstreams_chunk`` partitioned by day, with the days ahead that ``ensure`` makes;
    return the partitions made. The table as it was becomes the default partition, whole: no row
    is copied. Its few rows whose (random) stream ids fall in a day made are moved into that day,
    and the one check that it holds no others scans it once, all under the table's lock (``locked``).
    Nothing is done to a table already partitioned but ``ensure``.

    Raises:
        OperationalError: the table's lock was not had (``busy``); nothing changed.
    """
    alias = using or conf.database()

    def work(cursor: Any) -> list[str]:
        if not is_partitioned(alias):
            cursor.execute(f"ALTER TABLE {TABLE} RENAME TO {DEFAULT}")
            cursor.execute(f"ALTER INDEX {TABLE}_pkey RENAME TO {DEFAULT}_pkey")
            cursor.execute(
                f"CREATE TABLE {TABLE} (LIKE {DEFAULT} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE"
                " INCLUDING COMPRESSION) PARTITION BY RANGE (stream_id)"
            )
            cursor.execute(f'ALTER TABLE {TABLE} ADD CONSTRAINT {TABLE}_pkey PRIMARY KEY (stream_id, "offset")')
            cursor.execute(f"ALTER TABLE {TABLE} ALTER COLUMN stream_id SET (n_distinct = {_N_DISTINCT})")
            cursor.execute(f"ALTER TABLE {TABLE} ATTACH PARTITION {DEFAULT} DEFAULT")
        return _make(cursor, ahead, alias, today)

    return locked(alias, work)


def ensure(ahead: int = 7, *, using: str | None = None, today: datetime.date | None = None) -> list[str]:
    """If a day from today to ``ahead`` days on (UTC) has no partition, make every one missing up
    to twice as far, in one transaction under the table's lock (``locked``); return their names.
    Days are thus made about ``ahead`` at a time. The default partition's rows whose ids fall in
    the days made (a random id can) move into them, and the check that it holds no others scans
    it once: a moment when it is empty, as it is in a table partitioned from its start.

    Raises:
        ValueError: the table is not partitioned (``convert`` it).
        OperationalError: the table's lock was not had (``busy``); nothing changed.
    """
    if ahead < 0:
        raise ValueError("ahead must be 0 or more days")
    alias = using or conf.database()
    if not is_partitioned(alias):
        raise ValueError(f"{TABLE} is not partitioned: run manage.py pgstreams_partition once to convert it")
    if not _missing(ahead, alias, today):
        return []  # no lock taken
    return locked(alias, lambda cursor: _make(cursor, ahead, alias, today))


def _missing(ahead: int, alias: str, today: datetime.date | None) -> list[datetime.date]:
    """The days ``ensure`` makes now: none while today to ``ahead`` days on have partitions."""
    today = today or datetime.datetime.now(datetime.UTC).date()
    made = {day for day, _ in days(alias)}
    if all(today + n * _DAY in made for n in range(ahead + 1)):
        return []
    return [today + n * _DAY for n in range(2 * ahead + 1) if today + n * _DAY not in made]


def _make(cursor: Any, ahead: int, alias: str, today: datetime.date | None) -> list[str]:
    """``ensure``'s work, under the table's lock: the days missing now (another process may
    have made them meanwhile)."""
    missing = _missing(ahead, alias, today)
    if not missing:
        return []
    low, high = missing[0], missing[-1] + _DAY
    cursor.execute(
        f"CREATE TEMPORARY TABLE pgstreams_moving ON COMMIT DROP AS WITH moved AS (DELETE FROM {DEFAULT}"
        f" WHERE stream_id >= %s AND stream_id < %s RETURNING *) SELECT * FROM moved",
        [bound(low), bound(high)],
    )
    cursor.execute(f"ALTER TABLE {DEFAULT} DROP CONSTRAINT IF EXISTS {_OUTSIDE}")
    cursor.execute(
        f"ALTER TABLE {DEFAULT} ADD CONSTRAINT {_OUTSIDE} CHECK (stream_id < {_at(low)} OR stream_id >= {_at(high)})"
    )
    for day in missing:
        cursor.execute(
            f"CREATE TABLE {name(day)} PARTITION OF {TABLE} FOR VALUES FROM ({_at(day)}) TO ({_at(day + _DAY)})"
        )
        cursor.execute(f"ALTER TABLE {name(day)} ALTER COLUMN stream_id SET (n_distinct = {_N_DISTINCT})")
    cursor.execute(f"INSERT INTO {TABLE} SELECT * FROM pgstreams_moving")
    return [name(day) for day in missing]


def days(using: str | None = None, *, marked: bool = False) -> list[tuple[datetime.date, str]]:
    """The day partitions, oldest first; ``marked``, only those ``mark_dropping`` marked."""
    with connections[using or conf.database()].cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = %s::regclass AND c.relname <> %s"
            " AND (NOT %s OR obj_description(c.oid, 'pg_class') = %s) ORDER BY c.relname",
            [TABLE, DEFAULT, marked, _DROPPING],
        )
        return [(datetime.datetime.strptime(row[0][-8:], "%Y%m%d").date(), row[0]) for row in cursor.fetchall()]


# Streams of a day (by id) that keep it: not deleted, and open or closed since the cutoff.
_KEEPS_SQL = (
    "SELECT EXISTS (SELECT FROM pgstreams_stream WHERE id >= %s AND id < %s AND deleted_at IS NULL"
    " AND (closed_at IS NULL OR closed_at >= %s))"
)


def droppable(cutoff: datetime.datetime, using: str | None = None) -> list[datetime.date]:
    """The day partitions that ended before ``cutoff`` and whose every stream was closed before
    it (or is a tombstone, which holds no chunk)."""
    alias = using or conf.database()
    found = []
    for day, _ in days(alias):
        if datetime.datetime(day.year, day.month, day.day, tzinfo=datetime.UTC) + _DAY > cutoff:
            break
        with connections[alias].cursor() as cursor:
            cursor.execute(_KEEPS_SQL, [bound(day), bound(day + _DAY), cutoff])
            if not cursor.fetchone()[0]:
                found.append(day)
    return found


def streams_of(day: datetime.date, using: str | None = None) -> list[uuid.UUID]:
    """The streams of ``day`` (by id), tombstones left out."""
    with connections[using or conf.database()].cursor() as cursor:
        cursor.execute(
            "SELECT id FROM pgstreams_stream WHERE id >= %s AND id < %s AND deleted_at IS NULL ORDER BY id",
            [bound(day), bound(day + _DAY)],
        )
        return [row[0] for row in cursor.fetchall()]


# The day a transaction's deletes of streams leave the chunks of, for its partition's drop (the
# trigger of migration 0009 reads it): "low high", or none.
_DAY_DROPPED_SQL: Final = "SELECT set_config('pgstreams.day_dropped', %s, true)"


@contextlib.contextmanager
def dropping_day(cursor: Any, day: datetime.date) -> Iterator[None]:
    """In the block (in a transaction), the streams of ``day`` deleted leave their chunks for the
    day's ``drop``; any other stream deleted loses its chunks as before."""
    cursor.execute(_DAY_DROPPED_SQL, [f"{bound(day)} {bound(day + _DAY)}"])
    yield  # on an error, the transaction's rollback takes the setting with it
    cursor.execute(_DAY_DROPPED_SQL, [""])


def _held(cursor: Any, day: datetime.date, mode: str) -> bool:
    """Lock ``day``'s partition in ``mode`` for the caller's transaction; False if it is gone
    (another prune dropped it, perhaps while this waited for the lock)."""
    try:
        with transaction.atomic(using=cursor.db.alias):
            cursor.execute(f"LOCK TABLE {name(day)} IN {mode} MODE")
    except ProgrammingError as exc:
        if getattr(exc.__cause__, "sqlstate", None) != "42P01":  # undefined_table
            raise
        return False
    return True


def mark_dropping(day: datetime.date, using: str | None = None) -> bool:
    """Say, on ``day``'s partition, that its streams are being deleted without their chunks: if
    the day is kept after all (a stream made in it since, a process stopped), ``prune`` removes
    what they left (``days(marked=True)``, ``remove_orphans``). False if the day is gone."""
    alias = using or conf.database()
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        if not _held(cursor, day, "SHARE UPDATE EXCLUSIVE"):  # the lock COMMENT takes
            return False
        cursor.execute(f"COMMENT ON TABLE {name(day)} IS '{_DROPPING}'")
        return True


def drop(day: datetime.date, using: str | None = None) -> bool:
    """Drop ``day``'s partition, under the table's lock (``locked``), if no stream of the day is
    left (tombstones hold no chunk): the caller deleted them first (``dropping_day``). Returns
    whether it went; not if another process dropped it meanwhile, or a stream was made in the day
    since (its chunks stay).

    Raises:
        OperationalError: the table's lock was not had (``busy``); nothing was dropped.
    """
    alias = using or conf.database()
    if streams_of(day, alias):  # also clears the index of the rows just deleted before the lock
        return False

    def work(cursor: Any) -> bool:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [name(day)])
        if not cursor.fetchone()[0] or streams_of(day, alias):
            return False
        # The day's ids may be given to the default partition again (by a clock behind, or an
        # id given): its check keeps out the days last made, which this day may be one of.
        cursor.execute(f"ALTER TABLE {DEFAULT} DROP CONSTRAINT IF EXISTS {_OUTSIDE}")
        cursor.execute(f"DROP TABLE {name(day)}")
        return True

    return locked(alias, work)


def remove_orphans(day: datetime.date, using: str | None = None) -> int:
    """Delete the chunks left in ``day``'s partition by streams deleted in ``dropping_day`` when
    the day is kept after all (an object of the project keeps a stream of it, a stream was made
    in it since, a process stopped between the two), and its mark; how many. One statement over
    the day."""
    alias = using or conf.database()
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        if not _held(cursor, day, "SHARE UPDATE EXCLUSIVE"):
            return 0
        cursor.execute(
            f"DELETE FROM {name(day)} AS c"
            " WHERE NOT EXISTS (SELECT FROM pgstreams_stream AS s WHERE s.id = c.stream_id)"
        )
        removed = cursor.rowcount
        cursor.execute(f"COMMENT ON TABLE {name(day)} IS NULL")
        return removed
