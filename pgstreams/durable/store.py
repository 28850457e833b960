"""The Durable Streams endpoint's database work: find a stream by its path, then delete it in one
transaction on ``DATABASE``, describe or read it, or find it for an append (which ``appends``
commits, in batches) or a create (``creates``), with the request's authorization
(``PGSTREAMS['DURABLE_AUTHORIZE']``) asked before anything about the stream is told (a missing
stream is asked about as None).

Synchronous (the views run it on pgstreams' threads; ``aallowed`` asks an ``async def`` rule on
the event loop) and free of HTTP: a request the protocol refuses raises ``wire.Refused``. Live
reads wait on the listener in the views, not here.

Expiry is applied when a stream is looked up: an expired stream is removed there and then, and
the request sees no stream. A stream deleted while forks of it remain is kept as a tombstone that
holds its path (``deleted_at``); forks own copies of the chunks they inherit, so the tombstone
keeps no chunks, and it goes with its last fork (unless the project's objects keep it: then
pruning's sweep takes it once they let it go).
"""

from __future__ import annotations

import datetime
import inspect
import logging
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from asgiref.sync import async_to_sync
from django.db import OperationalError, connections, transaction
from django.db.models import ProtectedError, RestrictedError
from django.db.models.deletion import Collector

from .. import appender, conf, leases, runs
from ..batch import EXPIRY_PASSED
from ..models import Stream, is_text, media_type
from ..types import Mark
from ..writer import committed, pgstreams_cursor
from . import wire
from .wire import Refused

logger = logging.getLogger("pgstreams.durable")

Action = Literal["create", "append", "close", "delete", "read"]

# A catch-up response holds at most this many chunks, and stops after the chunk that reaches
# this many bytes.
READ_CHUNKS = 1000
READ_BYTES = 1 << 20


# A write waits at most this long in its transaction (on a thread) for a stream's row, or a path,
# that another transaction holds; the view tries again, with no thread held in between (``Busy``).
LOCK_WAIT = 0.1


class Busy(Refused):
    """Another transaction holds the stream's row: the write may be tried again."""

    def __init__(self, path: str) -> None:
        super().__init__(
            503,
            f"the stream at {path!r} is being written by a transaction that holds it; try again",
            {"Retry-After": "1"},
        )


@dataclass(frozen=True, slots=True)
class State:
    """What a response says about a stream."""

    id: uuid.UUID
    content_type: str
    next_offset: int
    closed: bool
    ttl: int | None
    expires_at: datetime.datetime | None
    leased: bool = False  # its writer holds a lease on it (``leases``)

    @classmethod
    def of(cls, stream: Stream) -> State:
        return cls(
            stream.id,
            stream.content_type,
            stream.next_offset,
            stream.is_closed,
            stream.ttl,
            stream.expires_at,
            isinstance(stream.metadata, dict) and leases.KEY in stream.metadata,  # a dict, unless an admin made it else
        )

    @property
    def json_mode(self) -> bool:
        return media_type(self.content_type) == "application/json"

    @property
    def binary(self) -> bool:
        return not is_text(self.content_type)


@dataclass(frozen=True, slots=True)
class Appended:
    state: State
    status: int  # 204, or 200 for a producer's new batch
    producer: tuple[int, int] | None = None  # (epoch, highest seq accepted) for the headers


@dataclass(frozen=True, slots=True)
class Read:
    state: State
    start: int
    chunks: list[str | bytes]

    @property
    def end(self) -> int:
        return self.start + len(self.chunks)

    @property
    def up_to_date(self) -> bool:
        return self.end >= self.state.next_offset


def authorize(request: Any, action: Action, path: str, stream: Stream | None) -> None:
    """Refuse (403) unless DURABLE_AUTHORIZE lets the request ``action`` the stream."""
    if not allowed(request, action, path, stream):
        raise refusal(action, path)


def allowed(request: Any, action: Action, path: str, stream: Stream | None) -> bool:
    """Whether DURABLE_AUTHORIZE lets the request ``action`` the stream. A rule that raises
    refuses, and is logged: its answer must not depend on whether the stream exists. An
    ``async def`` rule runs on the event loop that handed this thread the request."""
    try:
        answer = conf.durable_authorize()(request, action, path, stream)
        if inspect.isawaitable(answer):  # an async def rule, or an object whose __call__ is one
            answer = async_to_sync(_awaited)(answer)
        return bool(answer)
    except Exception:
        return _raised(action, path)


async def _awaited(answer: Awaitable[bool]) -> bool:
    return await answer


async def aallowed(
    rule: Callable[..., Awaitable[bool]], request: Any, action: Action, path: str, stream: Stream
) -> bool:
    """``allowed()`` on the event loop, for an ``async def`` rule."""
    try:
        return bool(await rule(request, action, path, stream))
    except Exception:
        return _raised(action, path)


def _raised(action: Action, path: str) -> bool:
    """A rule that raised refuses: logged, with the exception being handled."""
    logger.exception("pgstreams: DURABLE_AUTHORIZE raised for %s %r; the request is refused", action, path)
    return False


def refusal(action: Action, path: str) -> Refused:
    return Refused(403, f"not allowed to {action} stream {path!r}")


# The stream at a path, and whether its expiry has passed by the database's clock at this moment
# (a transaction's now() is its start, and the application server's clock is another clock), as
# one prepared statement: every request starts with it, and building it through the ORM cost
# more than the rest of an append.
_COLUMNS = [field.attname for field in Stream._meta.concrete_fields]
_METADATA = Stream._meta.get_field("metadata")
_EXPIRED = f"(deleted_at IS NULL AND {EXPIRY_PASSED})"
_LOOKUP_SQL = f"SELECT {', '.join(_COLUMNS)}, coalesce({_EXPIRED}, false) FROM pgstreams_stream WHERE path = %s"


def lookup(request: Any, action: Action, alias: str, path: str, *, lock: bool = False) -> Stream | None:
    """The stream at ``path`` (tombstones included), once DURABLE_AUTHORIZE lets the request
    ``action`` it: the rule is asked before anything about the path is told, and before any
    lock is taken (about None for a stream that is missing, deleted or expired). With ``lock``
    the stream's row is then locked, waiting at most LOCK_WAIT (``Busy`` after), and the rule
    asked again if the row changed meanwhile (a path with no row has none to lock). An expired
    stream the request may act on is removed then (a tombstone stays if it has forks) and counts
    as none; a refused request removes nothing."""
    stream, expired = _select(alias, path, lock=False)
    authorize(request, action, path, None if expired else _visible(stream))
    if lock and stream is not None:
        locked, expired = _select(alias, path, lock=True)
        if _changed(stream, locked):
            authorize(request, action, path, None if expired else _visible(locked))
        stream = locked
    if stream is not None and expired and _remove_if_expired(alias, stream.id):
        stream, _ = _select(alias, path, lock=lock)
    return stream


def _changed(before: Stream | None, after: Stream | None) -> bool:
    if before is None or after is None:
        return before is not after
    return (before.id, before.owner_id, before.deleted_at) != (after.id, after.owner_id, after.deleted_at)


def _select(alias: str, path: str, *, lock: bool) -> tuple[Stream | None, bool]:
    with pgstreams_cursor(alias) as cursor:
        if lock:
            bound_lock_waits(cursor)
        with busy_if_held(path):
            cursor.execute(_LOOKUP_SQL + (" FOR NO KEY UPDATE" if lock else ""), [path])
        row = cursor.fetchone()
    if row is None:
        return None, False
    stream = Stream.from_db(alias, _COLUMNS, row[:-1])
    # The row comes as the database sent it: Django's cursor leaves jsonb as its text, which
    # only the ORM's queries turn into the field's value.
    stream.metadata = _METADATA.from_db_value(stream.metadata, None, connections[alias])
    return stream, row[-1]


def bound_lock_waits(cursor: Any) -> None:
    """End every lock wait of the rest of this transaction after LOCK_WAIT (set_config's third
    argument: for this transaction only)."""
    cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{int(LOCK_WAIT * 1000)}ms"])


@contextmanager
def busy_if_held(path: str) -> Iterator[None]:
    """A lock wait that ran out of LOCK_WAIT as ``Busy``."""
    try:
        yield
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == "55P03":  # lock_not_available
            raise Busy(path) from None
        raise


def _remove_if_expired(alias: str, stream_id: uuid.UUID) -> bool:
    """Remove the stream if its expiry has passed, checked under its row lock; a stream whose row
    another transaction holds (or a row that points at it: FOR UPDATE) is being used, and stays.
    No idle bound: Django's delete runs the project's signal receivers, which take the time they
    take, as in any delete of the project's."""
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM pgstreams_stream WHERE id = %s AND {_EXPIRED} FOR UPDATE SKIP LOCKED",  # constants
            [stream_id],
        )
        if cursor.fetchone() is None:
            return False
        _remove(alias, Stream.objects.using(alias).get(pk=stream_id))
        return True


def _existing(path: str, stream: Stream | None) -> Stream:
    """``stream``, or 404 (none) or 410 (a tombstone)."""
    if stream is None:
        raise Refused(404, f"no stream at {path!r}")
    if stream.deleted_at is not None:
        raise Refused(410, f"the stream at {path!r} was deleted (forks of it remain)")
    return stream


def _visible(stream: Stream | None) -> Stream | None:
    """What the authorization hook is shown: the stream, unless it is a tombstone."""
    return stream if stream is not None and stream.deleted_at is None else None


# Locks a stream's row against every other writer, and against rows that would point at it (an
# insert of one takes FOR KEY SHARE of it): what Django finds pointing at the stream stays all
# there is until the transaction ends.
LOCK_FOR_DELETE_SQL = "SELECT 1 FROM pgstreams_stream WHERE id = %s FOR UPDATE"

# Of some streams, those that forks were made of.
_FORKED_SQL = "SELECT DISTINCT forked_from_id FROM pgstreams_stream WHERE forked_from_id = ANY(%s)"

# Tombstones: closed, so that writers are refused, and without chunks (forks own copies of theirs).
_TOMBSTONE_SQL = (
    "UPDATE pgstreams_stream SET deleted_at = now(), closed_at = coalesce(closed_at, now()) WHERE id = ANY(%s)"
)
_EMPTY_SQL = "DELETE FROM pgstreams_chunk WHERE stream_id = ANY(%s)"


def check_deletable(alias: str, ids: Collection[uuid.UUID]) -> None:
    """Ask Django whether it would delete the streams ``ids``, deleting nothing. Forks are never
    in the way: their ``forked_from`` is SET_NULL, which Django would apply, not refuse. The answer
    holds while the rows are locked with ``LOCK_FOR_DELETE_SQL``.

    Raises:
        ProtectedError, RestrictedError: objects of the project keep one (on_delete PROTECT, RESTRICT).
    """
    Collector(using=alias).collect(list(Stream.objects.using(alias).filter(pk__in=list(ids))))


def delete_streams(alias: str, ids: Collection[uuid.UUID]) -> set[uuid.UUID]:
    """Delete the streams ``ids``, whose rows the caller's transaction holds with
    ``LOCK_FOR_DELETE_SQL``, as Django deletes them: the project's objects that point at one go
    with it as their ``on_delete`` says, and its chunks by the table's trigger. A stream forks
    were made of is kept as a tombstone instead, once Django would delete it (its project's objects
    stay until the tombstone goes). Returns the ids kept as tombstones. Shared by the Durable
    Streams DELETE, expiry and ``pgstreams_prune``.

    Raises:
        ProtectedError, RestrictedError: objects of the project keep one of the streams (on_delete
            PROTECT, RESTRICT); nothing was changed.
    """
    with connections[alias].cursor() as cursor:
        cursor.execute(_FORKED_SQL, [list(ids)])
        forked = {stream_id for (stream_id,) in cursor.fetchall()}
        if forked:  # raw SQL makes the tombstones: Django is asked first
            check_deletable(alias, forked)
        if rest := [stream_id for stream_id in ids if stream_id not in forked]:
            Stream.objects.using(alias).filter(pk__in=rest).delete()  # it asks before it deletes anything
        if forked:
            cursor.execute(_TOMBSTONE_SQL, [list(forked)])
            cursor.execute(_EMPTY_SQL, [list(forked)])
    return forked


# A tombstone, locked as LOCK_FOR_DELETE_SQL locks; the stream it was forked from. A tombstone
# gains no fork: a fork of one is refused under its row lock.
_TOMBSTONE_LOCK_SQL = "SELECT forked_from_id FROM pgstreams_stream WHERE id = %s AND deleted_at IS NOT NULL FOR UPDATE"
# Whether forks of a stream remain: a statement of its own, so that its snapshot, taken once the
# lock above was had, sees the delete of a fork whose transaction held that lock first.
_FORKS_LEFT_SQL = "SELECT 1 FROM pgstreams_stream WHERE forked_from_id = %s LIMIT 1"


def _remove_orphan(alias: str, stream_id: uuid.UUID, *, wait: bool = True) -> tuple[bool, uuid.UUID | None]:
    """Delete the tombstone ``stream_id`` if its forks are all gone and Django would delete it, in
    a savepoint of the caller's transaction: a tombstone the project's objects keep stays (and
    never stops the delete of its fork). The delete of a fork waits for the lock of its tombstone,
    which the delete of its last other fork holds until it commits; without ``wait`` (pruning's
    sweep) a tombstone another transaction holds is left for a later sweep. Returns whether it
    went, and the stream it was forked from."""
    with connections[alias].cursor() as cursor:
        cursor.execute(_TOMBSTONE_LOCK_SQL if wait else _TOMBSTONE_LOCK_SQL + " SKIP LOCKED", [stream_id])
        row = cursor.fetchone()
        if row is None:
            return False, None
        cursor.execute(_FORKS_LEFT_SQL, [stream_id])
        if cursor.fetchone() is not None:
            return False, None
    try:
        with transaction.atomic(using=alias):
            Stream.objects.using(alias).filter(pk=stream_id).delete()
    except (ProtectedError, RestrictedError):
        return False, None
    return True, row[0]


def _remove(alias: str, stream: Stream) -> None:
    """Delete a stream as Django deletes it (``delete_streams``); while forks of it remain, leave a
    tombstone that keeps its path. A tombstone whose last fork this was goes too, if Django would
    delete it, and so on up the chain. Its readers learn it once the transaction commits.

    Raises:
        Refused: 409, objects of the project keep the stream (on_delete PROTECT, RESTRICT); or
            ``Busy``, another transaction holds its row (within a request's LOCK_WAIT).
    """
    with connections[alias].cursor() as cursor, busy_if_held(stream.path or str(stream.id)):
        cursor.execute(LOCK_FOR_DELETE_SQL, [stream.id])  # FOR UPDATE: the lookup's lock lets rows point at it
    try:
        kept = delete_streams(alias, [stream.id])
    except (ProtectedError, RestrictedError):
        raise Refused(
            409,
            f"the stream at {stream.path or stream.id!r} is kept by objects of the project that point at it"
            " (on_delete PROTECT or RESTRICT): delete them first",
        ) from None
    gone = [Mark(stream.id, stream.next_offset, True)]
    transaction.on_commit(partial(committed, conf.notify_mode(), gone, 0), using=alias)
    parent = None if kept else stream.forked_from_id
    while parent is not None:
        _, parent = _remove_orphan(alias, parent)


def remove(alias: str, stream_id: uuid.UUID) -> bool:
    """Delete a stream as a DELETE request does (a tombstone while forks of it remain), in a
    transaction of its own, under its row lock; False if there was none. For the admin."""
    with transaction.atomic(using=alias):
        stream = Stream.objects.using(alias).select_for_update(no_key=True).filter(pk=stream_id).first()
        if stream is None:
            return False
        _remove(alias, stream)
        return True


# Streams whose expiry has passed, by the database's clock.
EXPIRED_WHERE = _EXPIRED


def remove_expired(alias: str, limit: int) -> int:
    """Remove up to ``limit`` streams whose expiry has passed, as a request to them would (one
    that has forks leaves a tombstone); return how many went."""
    with connections[alias].cursor() as cursor:
        query = f"SELECT id FROM pgstreams_stream WHERE {EXPIRED_WHERE} LIMIT %s"  # a constant
        cursor.execute(query, [limit])
        candidates = [stream_id for (stream_id,) in cursor.fetchall()]
    return sum(_remove_if_expired(alias, stream_id) for stream_id in candidates)


# Tombstones none of whose forks remain (pruning deletes a closed fork without its source), but
# those seen kept by the project's objects.
_ORPHANS_SQL = (
    "SELECT t.id FROM pgstreams_stream AS t WHERE t.deleted_at IS NOT NULL AND t.id <> ALL(%s)"
    " AND NOT EXISTS (SELECT 1 FROM pgstreams_stream AS f WHERE f.forked_from_id = t.id) LIMIT 100"
)


def remove_orphan_tombstones(alias: str) -> int:
    """Remove the tombstones whose forks are all gone, up the chains, each in a transaction of its
    own as Django deletes it (one the project's objects keep stays); return how many went."""
    removed, kept = 0, []
    while True:
        with connections[alias].cursor() as cursor:
            cursor.execute(_ORPHANS_SQL, [kept])
            orphans = [stream_id for (stream_id,) in cursor.fetchall()]
        if not orphans:
            return removed
        for stream_id in orphans:
            with transaction.atomic(using=alias):
                gone, _ = _remove_orphan(alias, stream_id, wait=False)
            if gone:
                removed += 1
            else:
                kept.append(stream_id)


def head(request: Any, path: str) -> State:
    """HEAD: the stream's state (a HEAD does not count as use for its TTL)."""
    return State.of(_existing(path, lookup(request, "read", conf.database(), path)))


def read(request: Any, path: str, offset: str) -> Read:
    """GET: the chunks from ``offset`` (``-1``, ``now`` or one this server gave), as many as one
    response holds, up to the stream's tail when the read began."""
    alias = conf.database()
    stream = _existing(path, lookup(request, "read", alias, path))
    if stream.ttl is not None:
        _use(alias, stream)
    state = State.of(stream)
    if offset == wire.START:
        start = 0
    elif offset == wire.NOW:
        start = state.next_offset
    else:
        start = wire.parse_offset(offset)
        if start > state.next_offset:
            raise Refused(400, f"offset {offset} is past the stream's tail {wire.format_offset(state.next_offset)}")
    return Read(state, start, _chunks(alias, state.id, start, state.next_offset))


def _use(alias: str, stream: Stream) -> None:
    """Count a read as use of a stream with a TTL. A row another transaction holds is being
    written, which counts as use already: the read does not wait for it."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "UPDATE pgstreams_stream SET used_at = clock_timestamp() WHERE id = ("
            "SELECT id FROM pgstreams_stream WHERE id = %s FOR NO KEY UPDATE SKIP LOCKED)",
            [stream.id],
        )


# Chunks from an offset, as many as start within a response's bytes (their sizes read from the
# values' headers: nothing past the limit is loaded). A run (runs.py) counts whole, except the
# first row's, which may hold chunks before the offset; ``_chunks`` cuts what this lets in.
_CHUNKS_SQL = """
SELECT "offset", data, blob, run FROM (
    SELECT "offset", data, blob, run,
           sum(coalesce(octet_length(data), octet_length(blob))) OVER w
           - coalesce(octet_length(data), octet_length(blob))
           - first_value(CASE WHEN run IS NULL THEN 0 ELSE coalesce(octet_length(data), octet_length(blob)) END)
             OVER w AS before
    FROM pgstreams_chunk
    WHERE stream_id = %(stream)s AND "offset" >= %(start)s AND "offset" < %(end)s
    WINDOW w AS (ORDER BY "offset")
    ORDER BY "offset" LIMIT %(chunks)s
) AS c
WHERE before < %(bytes)s ORDER BY "offset"
"""


def _chunks(alias: str, stream_id: uuid.UUID, start: int, end: int) -> list[str | bytes]:
    """Chunks ``start`` to at most ``end - 1``, within one response's limits (at least one);
    410 if ``start`` is gone (pruned)."""
    if start >= end:
        return []
    params = {"stream": stream_id, "start": start, "end": end, "chunks": READ_CHUNKS, "bytes": READ_BYTES}
    # Unprepared, as Django's own cursor runs it; binary: a MiB of bytea as bytes, not 2 MiB of hex.
    with pgstreams_cursor(alias, prepare=False, binary=True) as cursor:
        cursor.execute(_CHUNKS_SQL, params)
        rows = cursor.fetchall()
    held = ((offset, data if data is not None else blob, run, None) for offset, data, blob, run in rows)
    chunks = runs.take(held, start, READ_CHUNKS, READ_BYTES)[0]  # up to a gap, if one comes first
    if not chunks:
        raise Refused(410, f"offset {wire.format_offset(start)} is no longer held (pruned)")
    return chunks


def delete(request: Any, path: str) -> None:
    """DELETE: remove the stream, or leave a tombstone while forks of it remain."""
    alias = conf.database()
    with transaction.atomic(using=alias):
        _remove(alias, _existing(path, lookup(request, "delete", alias, path, lock=True)))


def body_chunks(stream: Stream, body: bytes, *, appending: bool) -> list[str | bytes]:
    """A body as the stream's chunks: JSON messages one per chunk (an array's items, flattened);
    text or bytes cut to MAX_CHUNK_BYTES. At most what one batch of the append path commits
    (APPEND_BATCH chunks, BATCH_BYTES of data), or 413: an append is committed whole or not at
    all, and one batch is what the appender bounds its commits by."""
    limit, most = conf.max_chunk_bytes(), conf.append_batch()
    if media_type(stream.content_type) == "application/json":
        if not body:
            return []
        messages = wire.json_messages(body, most)
        if appending and not messages:
            raise Refused(400, "an append of an empty JSON array appends nothing; send at least one value")
        for message in messages:
            if len(message.encode()) > limit:
                raise Refused(413, f"a JSON message is over PGSTREAMS['MAX_CHUNK_BYTES'] = {limit} bytes")
        chunks: list[str | bytes] = list(messages)
    else:
        data: str | bytes = wire.text_body(body) if stream.holds_text else body
        chunks = list(wire.pieces(data, limit))
        if len(chunks) > most:
            raise Refused(
                413,
                f"the body makes {len(chunks)} chunks of PGSTREAMS['MAX_CHUNK_BYTES'] = {limit} bytes, over one "
                f"append's {most} (PGSTREAMS['APPEND_BATCH']); send it in several appends",
            )
    if (size := sum(map(len, chunks))) > (most_data := appender.BATCH_BYTES):
        raise Refused(
            413,
            f"the body holds {size} characters or bytes of data, over one append's {most_data}; "
            "send it in several appends",
        )
    return chunks


def find(
    request: Any, path: str, body: bytes, *, closing: bool, known: Stream | None = None
) -> tuple[Stream, list[str | bytes] | Refused | None]:
    """POST: the stream an append (or close, or both) goes to, once the request is allowed to,
    taking no lock, and the body as its chunks (None without one; the refusal of a body the
    stream cannot take, answered in its turn: a closed stream's 409 comes first); ``appends``
    judges and commits it. ``known`` is the stream this process last found at ``path``, asked
    about without reading it again (``appends`` checks in its batch that it is still the one
    there); a refusal of it is asked again of the stream read afresh."""
    action = post_action(body, closing=closing)
    stream = known if known is not None and allowed(request, action, path, known) else None
    if stream is None:
        stream = _existing(path, lookup(request, action, conf.database(), path))
    if closing and body:
        authorize(request, "close", path, stream)  # an append that closes needs both
    return stream, post_chunks(stream, body)


def post_action(body: bytes, *, closing: bool) -> Action:
    """What a POST does, as the rule is asked about it (an append that closes: ``append``, then ``close``)."""
    return "close" if closing and not body else "append"


def post_chunks(stream: Stream, body: bytes) -> list[str | bytes] | Refused | None:
    """A POST's body as the stream's chunks, or the refusal of it (None without a body)."""
    if not body:
        return None
    try:
        return body_chunks(stream, body, appending=True)
    except Refused as refused:
        return refused
