"""The Durable Streams PUT: create a stream (or a fork of one) at a path, or find one already
there with the same configuration (200) or another (409), with the request's authorization asked
first (``store.allowed``, about None when the path holds no stream).

A plain create (no fork, no body, not closed: what clients send before their appends) whose rule
allows it is one insert, committed by the appender with the other appends and creates in flight
in the process, while the request waits on the event loop (``plain``), and the stream is
remembered for the appends that follow (``appends.remember``); then Django's
``post_save`` (with a ``pre_save`` receiver for ``Stream``, the ORM's save makes it instead). The
insert waits at most LOCK_WAIT for another transaction making a stream at the same path, and
writes nothing when the path is taken: the create is then done the long way (``create``), on
pgstreams' threads, in one transaction: the lookup (and the fork's source, locked), the
comparison with a stream already there, the insert, the fork's inherited chunks and the body's.
Free of HTTP.
"""

from __future__ import annotations

import asyncio
import datetime
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

from asgiref.sync import iscoroutinefunction
from django.db import IntegrityError, connections, transaction
from django.db.models.functions import Now
from django.db.models.signals import post_save, pre_save

from .. import appender, batch, conf, notify, runs, threads
from ..auth import arequest_user
from ..exceptions import StreamError
from ..models import Stream, media_type
from ..types import Mark
from ..writer import after_commit, pgstreams_cursor
from . import appends, wire
from .store import LOCK_WAIT, State, aallowed, allowed, body_chunks, bound_lock_waits, busy_if_held, lookup
from .wire import Refused


@dataclass(frozen=True, slots=True)
class Fork:
    """A PUT's fork headers: the source's path, and where the fork leaves it."""

    source: str
    offset: int | None
    sub_offset: int


@dataclass(frozen=True, slots=True)
class Wanted:
    """What a PUT asks of the stream at its path: a stream created so, or one already so."""

    content_type: str | None  # None: the default, or a fork's source's
    ttl: int | None
    expires_at: datetime.datetime | None
    closed: bool
    fork: Fork | None


def create(request: Any, path: str, wanted: Wanted, body: bytes) -> tuple[State, bool]:
    """PUT: create the stream (or fork), or find it already there with the same configuration.
    Returns its state and whether it was created."""
    alias = conf.database()
    attempt = partial(_create, request, alias, path, wanted, body)
    try:
        with transaction.atomic(using=alias):
            return attempt()
    except IntegrityError:  # another request created it first: compare with that one
        with transaction.atomic(using=alias):
            return attempt()


def _create(request: Any, alias: str, path: str, wanted: Wanted, body: bytes) -> tuple[State, bool]:
    content_type, ttl, expires_at, closed, fork = (
        wanted.content_type,
        wanted.ttl,
        wanted.expires_at,
        wanted.closed,
        wanted.fork,
    )
    source = None
    if fork is not None:
        source = lookup(request, "read", alias, fork.source, lock=True)
        if source is None:
            raise Refused(404, f"no stream at {fork.source!r} to fork")
        if source.deleted_at is not None:
            raise Refused(409, f"the stream at {fork.source!r} was deleted; it cannot be forked")
        if content_type is None:
            content_type = source.content_type
        elif media_type(content_type) != media_type(source.content_type):
            raise Refused(409, f"a fork has its source's content type, {source.content_type}")
        if ttl is None and expires_at is None:
            ttl, expires_at = source.ttl, source.expires_at
    content_type = content_type or wire.DEFAULT_CONTENT_TYPE

    existing = lookup(request, "create", alias, path, lock=True)
    if existing is not None:
        if existing.deleted_at is not None:
            raise Refused(409, f"the stream at {path!r} was deleted while forks of it remain; its path stays taken")
        same = (
            media_type(existing.content_type) == media_type(content_type)
            and existing.ttl == ttl
            and existing.expires_at == expires_at
            and existing.is_closed == closed
            and _same_fork(existing, source, fork)
        )
        if not same:
            raise Refused(409, f"a stream exists at {path!r} with another configuration")
        return State.of(existing), False

    stream = _new(_owner(getattr(request, "user", None)), path, content_type, ttl, expires_at)
    items: list[str | bytes] = []
    across: tuple[list[str | bytes], list[datetime.datetime]] = ([], [])
    if source is not None and fork is not None:
        stream.forked_from = source
        stream.fork_offset = source.next_offset if fork.offset is None else fork.offset
        stream.fork_sub_offset = fork.sub_offset
        inherited, part = _fork_point(alias, source, stream.fork_offset, fork.sub_offset)
        across = _across(alias, source.id, inherited)
        _check_fork_cost(alias, source, inherited, across[0])
        items = [part] if part is not None else []
    else:
        inherited = 0
    items += body_chunks(stream, body, appending=False)
    # The insert waits on the path's index for another transaction making a stream there: at
    # most LOCK_WAIT, then Busy; once that one commits, create() compares with its stream.
    with pgstreams_cursor(alias) as cursor:
        bound_lock_waits(cursor)
    with busy_if_held(path):
        stream.save(using=alias, force_insert=True)
    if inherited:
        _copy_chunks(alias, stream.forked_from_id, stream.id, inherited, across)
    if items or inherited or closed:  # else the row just inserted says it all
        _append_chunks(alias, stream, inherited, items, closing=closed)
    return State.of(stream), True


def _same_fork(existing: Stream, source: Stream | None, fork: Fork | None) -> bool:
    if fork is None or source is None:
        return existing.forked_from_id is None and existing.fork_offset is None
    return (
        existing.forked_from_id == source.id
        and (fork.offset is None or fork.offset == existing.fork_offset)
        and fork.sub_offset == existing.fork_sub_offset
    )


# The source's rows below a fork's offset, copied as they are (a run, runs.py, stays one), and the
# run that holds that offset, if one does: its chunks below it are copied from Python.
_COPY_SQL = (
    'INSERT INTO pgstreams_chunk (stream_id, "offset", data, blob, created_at, run)'
    ' SELECT %s, "offset", data, blob, created_at, run FROM pgstreams_chunk WHERE stream_id = %s AND "offset" < %s'
)
_ACROSS_SQL = (
    'SELECT "offset", data, blob, created_at, run FROM pgstreams_chunk'
    ' WHERE stream_id = %s AND "offset" >= %s ORDER BY "offset" LIMIT 1'
)


def _across(alias: str, source_id: Any, offset: int) -> tuple[list[str | bytes], list[datetime.datetime]]:
    """The chunks below ``offset`` of the source's run that holds ``offset`` (none if no run
    does), as values and times."""
    with connections[alias].cursor() as cursor:
        cursor.execute(_ACROSS_SQL, [source_id, offset])
        row = cursor.fetchone()
    if row is None or row[4] is None:
        return [], []
    last, data, blob, created_at, run = row
    values, times = runs.unpack(data if data is not None else blob, run, created_at)
    below = max(0, offset - (last - len(values) + 1))  # a run past a pruned gap holds none below
    return values[:below], times[:below]


def _copy_chunks(
    alias: str, source_id: Any, fork_id: Any, inherited: int, across: tuple[list[str | bytes], list[datetime.datetime]]
) -> None:
    """Copy the source's chunks ``0`` to ``inherited - 1`` into the fork: its rows below, then
    ``across`` (``_across``: the part below of the run that holds ``inherited``) as a run."""
    with connections[alias].cursor() as cursor:
        cursor.execute(_COPY_SQL, [fork_id, source_id, inherited])
        values, times = across
        if values:
            value, run, created_at = runs.pack(values, times)
            text = isinstance(value, str)
            cursor.execute(
                'INSERT INTO pgstreams_chunk (stream_id, "offset", data, blob, created_at, run)'
                " VALUES (%s, %s, %s, %s, %s, %s)",
                [fork_id, inherited - 1, value if text else None, None if text else value, created_at, run],
            )


# What a chunk's copy costs besides its data: its row's header and columns, and its index entry.
CHUNK_ROW_BYTES = 100

# The inherited chunks' cost, counted over at most as many rows as the limit can pay for (a row
# holds a chunk or, a run's, several: its count is in its index's head).
_FORK_COST_SQL = f"""
SELECT coalesce(sum(coalesce(octet_length(data), octet_length(blob)) + {CHUNK_ROW_BYTES} * chunks), 0)
FROM (
    SELECT data, blob, CASE WHEN run IS NULL THEN 1 ELSE (
        SELECT get_byte(h, 3) + 256 * get_byte(h, 4) + 65536 * get_byte(h, 5) + 16777216::bigint * get_byte(h, 6)
        FROM (SELECT substring(run FROM 1 FOR 7)) AS head(h)
    ) END AS chunks
    FROM pgstreams_chunk WHERE stream_id = %s AND "offset" < %s ORDER BY "offset" LIMIT %s
) AS inherited
"""

# The streams a stream was forked from, up the chain (counted up to one past the limit).
_ANCESTORS_SQL = """
WITH RECURSIVE chain(id, depth) AS (
    SELECT forked_from_id, 1 FROM pgstreams_stream WHERE id = %s
    UNION ALL
    SELECT s.forked_from_id, c.depth + 1 FROM chain AS c JOIN pgstreams_stream AS s ON s.id = c.id
    WHERE c.depth <= %s
)
SELECT count(*) FROM chain WHERE id IS NOT NULL
"""


def _check_fork_cost(alias: str, source: Stream, inherited: int, across: list[str | bytes]) -> None:
    """Refuse a fork that would copy more than MAX_FORK_BYTES (its rows below ``inherited`` and
    ``across``, the chunks below it of the run that holds it), or make a chain of more than
    MAX_FORK_DEPTH forks."""
    most, deepest = conf.max_fork_bytes(), conf.max_fork_depth()
    with connections[alias].cursor() as cursor:
        cursor.execute(_FORK_COST_SQL, [source.id, inherited, most // CHUNK_ROW_BYTES + 1])
        (cost,) = cursor.fetchone()
        cost += sum(runs.octets(value) + CHUNK_ROW_BYTES for value in across)
        if cost > most:
            raise Refused(
                400,
                f"a fork at offset {wire.format_offset(inherited)} would copy more than "
                f"PGSTREAMS['MAX_FORK_BYTES'] = {most} bytes of the source (its chunks' data and {CHUNK_ROW_BYTES} "
                "bytes a chunk); fork at an earlier offset",
            )
        cursor.execute(_ANCESTORS_SQL, [source.id, deepest])
        (ancestors,) = cursor.fetchone()
    if ancestors + 1 > deepest:  # the source's forks above it, and this one
        raise Refused(
            400,
            f"a fork of this stream would make a chain of more than PGSTREAMS['MAX_FORK_DEPTH'] = {deepest} "
            "forks; fork a stream nearer the start of the chain",
        )


def _fork_point(alias: str, source: Stream, offset: int, sub_offset: int) -> tuple[int, str | bytes | None]:
    """How many of the source's chunks a fork at (offset, sub_offset) copies, and the part of the
    next one it takes (None: none). For JSON streams the sub-offset counts messages (chunks);
    for others, bytes of the chunk at ``offset``."""
    if offset > source.next_offset:
        raise Refused(400, f"Stream-Fork-Offset is past the source's tail {wire.format_offset(source.next_offset)}")
    if sub_offset == 0:
        return offset, None
    if offset >= source.next_offset:
        raise Refused(400, "Stream-Fork-Sub-Offset points past the source's data")
    if media_type(source.content_type) == "application/json":
        if offset + sub_offset > source.next_offset:
            raise Refused(400, f"Stream-Fork-Sub-Offset {sub_offset} is past the source's last message")
        return offset + sub_offset, None
    with connections[alias].cursor() as cursor:
        cursor.execute(_ACROSS_SQL, [source.id, offset])
        row = cursor.fetchone()
    value = None
    if row is not None:
        last, data, blob, _, run = row
        stored = data if data is not None else blob
        values = runs.unpack_values(stored, run) if run is not None else [stored]
        if (first := last - len(values) + 1) <= offset:
            value = values[offset - first]
    if value is None:
        raise Refused(400, "Stream-Fork-Offset names a chunk that is no longer held")
    whole = value.encode() if isinstance(value, str) else bytes(value)
    if sub_offset > len(whole):
        raise Refused(400, f"Stream-Fork-Sub-Offset {sub_offset} is past the end of that append ({len(whole)} bytes)")
    if not isinstance(value, str):
        return offset, whole[:sub_offset]
    try:
        return offset, whole[:sub_offset].decode()
    except UnicodeDecodeError:
        raise Refused(400, f"Stream-Fork-Sub-Offset {sub_offset} falls inside a UTF-8 character") from None


# A plain create's row, as Django would insert it (its fields' defaults and conversions), with
# created_at and used_at by the database's clock (on the appender's connection, whose time zone
# is not Django's); nothing if the path is taken.
_CLOCKED = ("created_at", "used_at")
_FIELDS = [field for field in Stream._meta.concrete_fields if field.attname not in _CLOCKED]
_INSERT_SQL = (
    "INSERT INTO pgstreams_stream ({columns}, created_at, used_at)"
    " VALUES ({values}, statement_timestamp(), statement_timestamp())"
    " ON CONFLICT (path) WHERE path IS NOT NULL DO NOTHING RETURNING id"
).format(
    columns=", ".join(f'"{field.column}"' for field in _FIELDS),  # constants: the model's own columns
    values=", ".join("%s" for _ in _FIELDS),
)


def _values(stream: Stream, alias: str) -> list[Any]:
    """``stream``'s row for _INSERT_SQL, as Django would convert it for ``alias`` (no query: safe
    on the event loop)."""
    connection = _converters.get(alias) or _converters.setdefault(alias, connections.create_connection(alias))
    return [field.get_db_prep_save(field.pre_save(stream, True), connection) for field in _FIELDS]


# A database wrapper per alias for _values' conversions only, never connected: on an event loop,
# ``connections[alias]`` makes a new wrapper for every request (Django's connections are per
# context there), which cost a create about a twelfth of its CPU.
_converters: dict[str, Any] = {}


@dataclass(slots=True, eq=False)
class _Insert(batch.Insert):
    """A plain create, as the appender's item: True once its stream is committed."""

    INSERT_SQL: ClassVar[str] = _INSERT_SQL
    LOCK_WAIT: ClassVar[float] = LOCK_WAIT


async def plain(request: Any, path: str, wanted: Wanted, body: bytes) -> State | None:
    """A plain create, committed by the appender with the appends and creates in flight in the
    process (``batch.Insert``), holding no thread while it waits; then ``post_save``, on a thread
    if anything receives it. None when the create is not plain, a ``pre_save`` receiver for
    Stream is connected, the rule refuses a create where there is none, or the path is taken (by
    a stream, a tombstone or an expired stream), or the batch could not make it: the long way
    (``create()``) then looks and answers."""
    if wanted.fork is not None or wanted.closed or body or pre_save.has_listeners(Stream):
        return None  # a pre_save receiver may change the row: the ORM's save runs it
    owner, allowed = await _asked(request, path)
    if not allowed:
        return None  # the rule may allow it of the stream there, if any: looked up the long way
    alias = conf.database()
    stream = _new(owner, path, wanted.content_type or wire.DEFAULT_CONTENT_TYPE, wanted.ttl, wanted.expires_at)
    loop = asyncio.get_running_loop()
    item = _Insert(stream.id, loop.create_future(), loop, values=_values(stream, alias))
    try:
        made = await appender.appender(alias).asubmit(item)
    except StreamError:  # not committed, or nobody can tell: the long way finds it or makes it
        return None
    if not made:
        return None
    stream._state.adding, stream._state.db = False, alias
    appends.remember(path, stream)  # its first append needs no lookup (a thread's hop and a query)
    if post_save.has_listeners(Stream):
        await _saved(stream, alias)
    return State.of(stream)


async def _asked(request: Any, path: str) -> tuple[Any, bool]:
    """The stream's owner (the signed-in user, or None), and whether the rule allows a create at
    ``path`` where there is no stream: an ``async def`` rule on the event loop, any other on a
    reading thread. The owner is the same user either way, and as the long way finds it:
    ``request.user`` as the middleware left it (``auth.arequest_user``)."""
    rule = conf.durable_authorize()
    if not iscoroutinefunction(rule):
        return await _ask(request, path)
    return _owner(await arequest_user(request)), await aallowed(rule, request, "create", path, None)


@threads.durable.wrap
def _ask(request: Any, path: str) -> tuple[Any, bool]:
    return _owner(getattr(request, "user", None)), allowed(request, "create", path, None)


def _owner(user: Any) -> Any:
    """``user`` if signed in, else None. It loads a lazy user: call it off the event loop, or with
    a user loaded already (``auth.arequest_user``'s)."""
    return user if user is not None and user.is_authenticated else None


@threads.durable_writes.wrap
def _saved(stream: Stream, alias: str) -> None:
    post_save.send(sender=Stream, instance=stream, created=True, update_fields=None, raw=False, using=alias)


def _new(owner: Any, path: str, content_type: str, ttl: int | None, expires_at: Any) -> Stream:
    """The stream a create makes at ``path``, owned by ``owner`` (a user, or None)."""
    return Stream(
        path=path,
        label=path[:200],
        content_type=content_type,
        ttl=ttl,
        expires_at=expires_at,
        used_at=Now(),  # the database's clock, which judges expiry
        owner=owner,
    )


# A request's chunks and the stream row's move, in one statement; chunks only for a row it moved
# (no foreign key checks them: migration 0006).
_APPEND_SQL = """
WITH moved AS (
    UPDATE pgstreams_stream SET next_offset = %(end)s, writer_seq = %(seq)s, used_at = clock_timestamp(),
        closed_at = CASE WHEN %(closing)s THEN coalesce(closed_at, now()) ELSE closed_at END
    WHERE id = %(id)s RETURNING closed_at
), written AS (
    INSERT INTO pgstreams_chunk (stream_id, "offset", data, blob, created_at)
    SELECT %(id)s, %(start)s + t.i - 1, t.data, t.blob, now()
    FROM moved, unnest(%(texts)s::text[], %(blobs)s::bytea[]) WITH ORDINALITY AS t(data, blob, i)
)
SELECT closed_at FROM moved
"""


def _append_chunks(alias: str, stream: Stream, start: int, items: list[str | bytes], *, closing: bool) -> None:
    """Insert ``items`` from offset ``start`` and move the stream's row to match, closing it if
    asked; announced once the transaction commits."""
    params = {
        "id": stream.id,
        "start": start,
        "end": start + len(items),
        "seq": stream.writer_seq,
        "closing": closing,
        "texts": [item if isinstance(item, str) else None for item in items],
        "blobs": [item if isinstance(item, bytes) else None for item in items],
    }
    with pgstreams_cursor(alias) as cursor:
        cursor.execute(_APPEND_SQL, params)
        (stream.closed_at,) = cursor.fetchone()
    stream.next_offset = start + len(items)
    mark = Mark(stream.id, stream.next_offset, stream.is_closed)
    mode = conf.notify_mode()
    if mode == "per_write":  # in the transaction, as write() sends it in this mode
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [notify.channel_for(mark.stream_id), notify.encode(mark)])
    after_commit(alias, mode, mark, len(items))
