"""Whether an append batch whose commit got no answer committed: asked of the database, on a
connection of the appender's, within a retry budget.

What the batch left is looked at first, facts no later transaction can undo: it committed if a
row it wrote is there with the batch's transaction as its writer (``xmin``): the first chunk it
gave one of its streams, a stream row it moved, a producer's state it saved; or if a stream it
made is there (its id is new). It did not if other transactions' chunks hold those places, or
if one of its streams is there but behind where the batch left it (fewer chunks, still open
where it closed it, a producer's state older than the batch's), or if a stream it made is not
there (one deleted in the moments since is made again). Only when nothing of the batch can be
found either way (every stream it wrote was deleted, pruned or expired since) does the
transaction's own status tell, which alone could answer for another transaction that reused its
id (after a failover to a standby that never saw the commit). Before concluding, a transaction
still in progress (its backend has not noticed the lost client) is ended by ending its backend.
Nothing here writes.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg.errors

from . import conf, db
from .batch import DEFERRED, Insert, Item, Outcome
from .types import Mark

logger = logging.getLogger("pgstreams.appender")

STATUS_SQL = "SELECT pg_xact_status(%s::xid8)"
# The inserters of the chunks at the places a batch gave its streams' first chunks: 32-bit
# transaction ids.
INSERTERS_SQL = (
    'SELECT xmin::text FROM pgstreams_chunk WHERE (stream_id, "offset") IN'
    " (SELECT * FROM unnest(%s::uuid[], %s::bigint[]))"
)
# The rows of the streams a batch moved or made, with their last writers.
STREAMS_SQL = "SELECT id, xmin::text, next_offset, closed_at IS NOT NULL FROM pgstreams_stream WHERE id = ANY(%s)"
# The states of the producers whose batches a batch recorded (or found recorded), with their writers.
PRODUCERS_SQL = (
    "SELECT p.stream_id, p.producer_id, p.epoch, p.seq, p.xmin::text FROM pgstreams_producer AS p"
    " JOIN unnest(%s::uuid[], %s::text[]) AS w(stream_id, producer_id)"
    " ON p.stream_id = w.stream_id AND p.producer_id = w.producer_id"
)
# Waits (up to the given milliseconds) for the backend to exit, so its transaction has ended.
TERMINATE_SQL = "SELECT pg_terminate_backend(%s, %s)"


@dataclass(frozen=True)
class Traces:
    """What a batch leaves beside its chunks, by which to tell whether it committed."""

    streams: tuple[Mark, ...] = ()  # each stream row it moved, as it left it
    # (stream, producer id, epoch, seq): a state its producer's row holds at least, once committed
    producers: tuple[tuple[uuid.UUID, str, int, int], ...] = ()
    created: tuple[uuid.UUID, ...] = ()  # the streams it made


def traces(items: Sequence[Item], outcome: Outcome) -> Traces:
    """The traces of the batch of ``items`` whose try gave ``outcome``. A producer's item it
    accepted recorded the producer's batch, or found it recorded (a duplicate): either way the
    producer's state is at least the item's once the batch committed. Not so for a close of a
    stream closed already, accepted without recording anything: so the producers of streams
    the batch closed, or did not move, are left out (their closing, or nothing, tells)."""
    producers, created = [], []
    moved = {mark.stream_id for mark in outcome.marks} - {mark.stream_id for mark in outcome.closed}
    for item, result in zip(items, outcome.results, strict=True):
        if result is DEFERRED or isinstance(result, BaseException):
            continue
        if isinstance(item, Insert):
            if result is True:
                created.append(item.stream_id)
        elif item.producer is not None and item.stream_id in moved:
            producers.append((item.stream_id, item.producer.id, item.producer.epoch, item.producer.seq))
    return Traces(tuple(outcome.marks), tuple(producers), tuple(created))


def committed(
    connection: Callable[[], psycopg.Connection[Any]],
    dropped: Callable[[], None],
    xid: str,
    pid: int,
    places: list[tuple[uuid.UUID, int]],
    failure: Exception,
    left: Traces | None = None,
) -> bool | None:
    """True, False, or None if no connection could tell within CONNECT_TIMEOUT + QUERY_TIMEOUT.
    ``connection()`` gives the appender's connection (opening one if needed), ``dropped()``
    closes it after a failure; ``places`` are the batch's first chunk in each stream it wrote,
    ``left`` the rest of what it leaves."""
    deadline = time.monotonic() + conf.connect_timeout() + conf.query_timeout()
    backoff = db.Backoff()
    while True:
        try:
            conn = connection()
            with db.watched(conn, "asking whether an append batch committed"):
                outcome = _judged(conn, xid, pid, places, left or Traces())
            if outcome is not None:
                logger.warning(
                    "pgstreams: an append batch's commit got no answer (%s); it %s",
                    failure,
                    "committed" if outcome else "did not commit",
                )
                return outcome
        except psycopg.Error:
            dropped()
        if time.monotonic() >= deadline:
            return None
        time.sleep(backoff.next())


def _judged(
    conn: psycopg.Connection[Any], xid: str, pid: int, places: list[tuple[uuid.UUID, int]], left: Traces
) -> bool | None:
    """Whether the batch committed, from its rows, else its transaction's status; None once a
    backend whose transaction was still in progress has been ended (ask again)."""
    mine = int(xid) % 2**32  # xmin is a 32-bit transaction id
    inserters: set[int] = set()
    if places:
        columns = [[sid for sid, _ in places], [offset for _, offset in places]]
        inserters = {int(x) for (x,) in conn.execute(INSERTERS_SQL, columns).fetchall()}
    ids = [mark.stream_id for mark in left.streams] + list(left.created) + [sid for sid, *_ in left.producers]
    ids = list(dict.fromkeys(ids))
    streams = {}
    if ids:
        streams = {row[0]: (int(row[1]), row[2], row[3]) for row in conn.execute(STREAMS_SQL, [ids]).fetchall()}
    states = {}
    if left.producers:
        columns = [[sid for sid, *_ in left.producers], [name for _, name, *_ in left.producers]]
        found = conn.execute(PRODUCERS_SQL, columns).fetchall()
        states = {(sid, name): ((epoch, seq), int(writer)) for sid, name, epoch, seq, writer in found}
    moved = [streams[mark.stream_id] for mark in left.streams if mark.stream_id in streams]
    if (
        mine in inserters
        or any(writer == mine for writer, _, _ in moved)
        or any(writer == mine for _, writer in states.values())
        or any(sid in streams for sid in left.created)
    ):
        return True
    status = _status(conn, xid)
    if status == "in progress":  # ask again, once it has ended
        conn.execute(TERMINATE_SQL, [pid, int(conf.query_timeout() * 1000 / 2)])
        return None
    # Others' chunks at its places; a stream it made not there (one there would have answered above).
    behind = bool(inserters) or bool(left.created)
    for mark in left.streams:  # a stream's chunks and closing are never undone
        if (row := streams.get(mark.stream_id)) is not None:
            _, next_offset, closed = row
            behind = behind or next_offset < mark.next_offset or (mark.closed and not closed)
    for sid, name, epoch, seq in left.producers:  # a producer's state only moves on, while its stream lives
        if sid in streams:
            state = states.get((sid, name))
            behind = behind or state is None or state[0] < (epoch, seq)
    return not behind and status == "committed"


def _status(conn: psycopg.Connection[Any], xid: str) -> str | None:
    """Transaction ``xid``'s status: "in progress", "committed", "aborted", or None for one too old
    to tell or that the server has not reached (it restarted from a WAL that never saw it, or
    another server took over)."""
    try:
        row = conn.execute(STATUS_SQL, [xid]).fetchone()
    except psycopg.errors.InvalidParameterValue:
        return None
    return None if row is None else row[0]
