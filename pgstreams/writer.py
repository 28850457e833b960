"""Write path: create_stream, write, write_many, close, and their async twins.

Each call is one statement on Django's connection for the alias, so it joins the caller's
transaction (the first write of a process to a stream asks for its content type first:
``contents``). After commit (``transaction.on_commit``) the stream's new high-water mark goes to
this process's notification buffer and wakes this process's readers; nothing is announced for a
transaction that rolls back. A stream deleted or past its Durable Streams expiry is no stream
here, as on the append path. Never reads chunks and never waits for a flush.
"""

from __future__ import annotations

from functools import cache, partial
from typing import Any, overload

import psycopg
from django.db import connections, transaction

from . import conf, contents, listener, metrics, notify, producers, signals, threads
from .batch import EXPIRY_PASSED
from .exceptions import ChunkTooLarge, InvalidChunk, StreamClosed, StreamNotFound
from .models import Stream, is_text, path_problem
from .types import Mark, Producer, stream_uuid

# The stream row's counter is taken and the chunk inserted in one statement. The UPDATE's row
# lock serialises the writers of one stream until commit, so per stream commit order is offset
# order and a rolled-back write leaves no gap. No row from the UPDATE: unknown, closed or expired
# stream. {level}, {from_level} and {notify} are filled in by _statement() from the constants
# below; {used_at} counts the write as use of a stream with a Durable Streams TTL, {expired} is
# true once its expiry has passed (then, as for append() and the endpoint, there is no stream).
_WRITE_SQL = """
WITH {level}s AS (
    UPDATE pgstreams_stream SET next_offset = next_offset + 1, used_at = {used_at} {from_level}
    WHERE id = %(id)s AND closed_at IS NULL AND NOT {expired}
    RETURNING next_offset - 1 AS off
)
INSERT INTO pgstreams_chunk (stream_id, "offset", data, created_at)
SELECT %(id)s, s.off, %(data)s, now() FROM s
RETURNING "offset"{notify}
"""

_WRITE_MANY_SQL = """
WITH {level}s AS (
    UPDATE pgstreams_stream SET next_offset = next_offset + %(n)s, used_at = {used_at} {from_level}
    WHERE id = %(id)s AND closed_at IS NULL AND NOT {expired}
    RETURNING next_offset - %(n)s AS base
)
INSERT INTO pgstreams_chunk (stream_id, "offset", data, created_at)
SELECT %(id)s, s.base + t.i - 1, t.data, now()
FROM s, unnest(%(items)s::text[]) WITH ORDINALITY AS t(data, i)
RETURNING "offset"{notify}
"""

_CLOSE_SQL = """
WITH {level}c AS (
    UPDATE pgstreams_stream SET closed_at = now(), used_at = {used_at} {from_level}
    WHERE id = %(id)s AND closed_at IS NULL AND NOT {expired}
    RETURNING next_offset
)
SELECT next_offset{notify} FROM c
"""

# A synchronous_commit level for the writing transaction: set_config(..., true) is SET LOCAL's
# function form, which takes its value as a parameter and runs inside the write's own statement
# (a bare SET LOCAL would be a second round trip, and does nothing outside a transaction block).
# The transaction's commit waits at the strongest level any pgstreams write in it asked for:
# pgstreams.synchronous_commit remembers it until the transaction (or savepoint) ends.
_LEVEL_CTE = """level AS (
    SELECT set_config('synchronous_commit', l.v, true) AS level,
           set_config('pgstreams.synchronous_commit', l.v, true) AS strongest
    FROM (SELECT (%(levels)s::text[])[GREATEST(
        array_position(%(levels)s::text[], %(level)s::text),
        array_position(%(levels)s::text[], current_setting('pgstreams.synchronous_commit', true))
    )] AS v) AS l
),
"""

# NOTIFY_MODE "per_write": the classic design, a notification inside the writing transaction
# (the benchmark's baseline). The payload is the same one the flusher sends.
_PER_WRITE_NOTIFY = ", pg_notify(%(channel)s, %(hex)s || ':' || ({next_offset}){suffix})"
_TEMPLATES = {
    "write": (_WRITE_SQL, _PER_WRITE_NOTIFY.format(next_offset='"offset" + 1', suffix="")),
    "write_many": (_WRITE_MANY_SQL, _PER_WRITE_NOTIFY.format(next_offset='"offset" + 1', suffix="")),
    "close": (_CLOSE_SQL, _PER_WRITE_NOTIFY.format(next_offset="next_offset", suffix=" || ':c'")),
}


# The database's clock at the statement, not the transaction's start (now()): a long transaction's
# writes must not stamp a time its own commit has already outlived.
_USED_AT = "CASE WHEN ttl IS NULL THEN used_at ELSE clock_timestamp() END"
_EXPIRED = f"coalesce({EXPIRY_PASSED}, false)"
# A stream deleted (a tombstone, closed too) or expired: for a writer, as for append(), no stream.
_GONE = f"(deleted_at IS NOT NULL OR {_EXPIRED})"
# Why a write found no row to write: no stream, one gone, or one closed.
_WHY_NOT_SQL = f"SELECT closed_at, {_GONE} FROM pgstreams_stream WHERE id = %s"


@cache
def _statement(kind: str, per_write: bool, with_level: bool) -> str:
    template, notify_sql = _TEMPLATES[kind]
    return template.format(
        used_at=_USED_AT,
        expired=_EXPIRED,
        level=_LEVEL_CTE if with_level else "",
        from_level="FROM level" if with_level else "",
        notify=notify_sql if per_write else "",
    )


def check_chunk(data: Any, limit: int) -> None:
    if not isinstance(data, str):
        raise TypeError(f"chunk data must be str, not {type(data).__name__}; decode bytes before writing")
    try:
        size = len(data.encode())
    except UnicodeEncodeError:
        raise InvalidChunk("chunk data is not valid Unicode text (it holds a lone surrogate)") from None
    if size > limit:
        raise ChunkTooLarge(
            f"chunk is {size} bytes in UTF-8, over PGSTREAMS['MAX_CHUNK_BYTES'] = {limit}; "
            "split it into smaller chunks (write_many takes a list)"
        )
    if "\x00" in data:
        raise InvalidChunk("chunk data holds a NUL character, which PostgreSQL text cannot store; remove or escape it")


def _check_contents(alias: str, sid: Any, items: list[str]) -> None:
    """Raise InvalidChunk if the stream's content type cannot hold ``items`` (``contents``);
    StreamNotFound if there is no such stream. Asks the database once per stream and process."""
    kind = contents.kinds.get(sid)
    if kind is None:
        with connections[alias].cursor() as cursor:
            cursor.execute(contents.LOOKUP_SQL, [[sid]])
            rows = cursor.fetchall()
        if not rows:
            raise StreamNotFound(f"no stream {sid} in database {alias!r}")
        contents.kinds.remember(rows)
        kind = contents.kind_of(rows[0][1])
    for data in items:
        contents.check_fits(kind, data, sid)


def _level(synchronous_commit: str | None) -> str | None:
    """The synchronous_commit level of a write: its argument, else the setting (None: the server's)."""
    if synchronous_commit is None:
        return conf.synchronous_commit()
    if synchronous_commit not in conf.SYNCHRONOUS_COMMIT_LEVELS:
        raise ValueError(
            f"synchronous_commit must be one of {', '.join(map(repr, conf.SYNCHRONOUS_COMMIT_LEVELS))} "
            f"or None, not {synchronous_commit!r}"
        )
    return synchronous_commit


def _execute(kind: str, alias: str, mode: str, level: str | None, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    sql = _statement(kind, mode == "per_write", level is not None)
    if mode == "per_write":
        params = {**params, "channel": notify.channel_for(params["id"]), "hex": params["id"].hex}
    if level is not None:
        params = {**params, "level": level, "levels": list(conf.SYNCHRONOUS_COMMIT_LEVELS)}
    with pgstreams_cursor(alias) as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
        if not rows:
            cursor.execute(_WHY_NOT_SQL, [params["id"]])
            found = cursor.fetchone()
            if found is None:
                raise StreamNotFound(f"no stream {params['id']} in database {alias!r}")
            if found[1]:
                raise StreamNotFound(f"no stream {params['id']} in database {alias!r}: it was deleted or expired")
            closed_at = found[0].isoformat()
            if kind == "close":
                raise StreamClosed(f"stream {params['id']} is already closed (since {closed_at})")
            raise StreamClosed(f"stream {params['id']} was closed at {closed_at}; create a new stream to write more")
    return rows


_NEVER_AUTOMATIC = 2**31 - 1


class _PgstreamsCursor(psycopg.Cursor):  # type: ignore[type-arg]
    """A server-binding cursor whose statements are prepared once per connection, if ``prepare``."""

    def __init__(self, connection: Any, *, prepare: bool, binary: bool) -> None:
        super().__init__(connection)
        self._prepare = True if prepare else None  # None: as the connection's threshold says (never)
        if binary:
            self.format = psycopg.pq.Format.BINARY

    def execute(
        self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool | None = None
    ) -> Any:
        return super().execute(query, params, prepare=self._prepare if prepare is None else prepare, binary=binary)


def pgstreams_cursor(alias: str, *, prepare: bool = True, binary: bool = False) -> Any:
    """A cursor on Django's connection (so it joins the caller's transaction), wrapped by Django
    (query logging, execute wrappers, error translation). With ``prepare``, its statements are
    prepared when PGSTREAMS['PREPARED_STATEMENTS'] allows: the server then parses and plans a
    write once per connection instead of once per write. With ``binary``, results come in binary
    format: a bytea as its bytes, not as hex text twice their size. Only for columns whose binary
    values Python gets as Django's cursor gives them (integers, text, bytea, uuid; not jsonb or
    inet, which Django loads as text, nor timestamps without USE_TZ)."""
    wrapper = connections[alias]
    prepare = prepare and conf.prepared_statements()
    if not prepare and not binary:
        return wrapper.cursor()
    wrapper.close_if_health_check_failed()  # CONN_HEALTH_CHECKS, as Django's own cursor() does
    wrapper.ensure_connection()
    wrapper.validate_thread_sharing()
    if prepare and wrapper.connection.prepare_threshold is None:
        # Django turns automatic preparing off (None), which also refuses prepare=True. A
        # threshold no query reaches keeps Django's queries unprepared and lets ours be.
        wrapper.connection.prepare_threshold = _NEVER_AUTOMATIC
    raw = _PgstreamsCursor(wrapper.connection, prepare=prepare, binary=binary)
    return wrapper.make_debug_cursor(raw) if wrapper.queries_logged else wrapper.make_cursor(raw)


def after_commit(alias: str, mode: str, mark: Mark, written: int) -> None:
    """Once the transaction on ``alias`` commits: count and announce what it wrote to one stream
    (``committed``) and, when ``mark`` says it closed the stream, send ``stream_closed``."""
    transaction.on_commit(partial(committed, mode, [mark], written), using=alias)
    if mark.closed:
        transaction.on_commit(partial(announce_closed, alias, [mark]), using=alias)


def announce_closed(alias: str, marks: list[Mark]) -> None:
    """Send ``stream_closed`` for each of ``marks``, streams whose closing has committed."""
    for mark in marks:
        signals.stream_closed.send(sender=Stream, stream_id=mark.stream_id, next_offset=mark.next_offset, using=alias)


def committed(mode: str, marks: list[Mark], written: int) -> None:
    """After commit: count the chunks, then announce the streams' marks as NOTIFY_MODE says
    (the per_write notifications were part of the transaction)."""
    metrics.chunks_written.inc(written)
    if mode == "buffered":
        notify.flusher().add(marks)
    if mode != "off":
        listener.announce_local(marks)


def create_stream(
    *,
    owner: Any = None,
    label: str = "",
    metadata: dict[str, Any] | None = None,
    path: str | None = None,
    content_type: str = "text/plain",
    using: str | None = None,
) -> Stream:
    """Create an open, empty stream and return it.

    Args:
        owner: the user who may read it (besides users with the pgstreams.view_stream permission);
            None makes it readable by its id alone. Deleting the user deletes the stream.
        label: a short description, shown in the admin (at most 200 characters).
        metadata: any JSON-serialisable dict.
        path: its name at the Durable Streams endpoint (``v1/stream/<path>``), unique; None
            gives it none. Readers there are authorized as for WebSocket and SSE
            (docs/reference/authorization.md).
        content_type: what its chunks are, for Durable Streams clients: a ``text/*`` type or
            ``application/json`` (one JSON value per chunk); ``write()`` stores text only.
        using: database alias; defaults to ``PGSTREAMS['DATABASE']``.

    Raises:
        ValueError: a bad label, path or content type, or text Postgres cannot store (a NUL
            character, a lone surrogate) in the label, path or metadata; IntegrityError: the path is
            taken.
    """
    if not isinstance(label, str) or len(label) > 200:
        raise ValueError("label must be a str of at most 200 characters")
    if metadata is not None and not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict, not {type(metadata).__name__}")
    for name, value in (("label", label), ("path", path), ("metadata", metadata)):
        if (problem := contents.unstorable(value)) is not None:
            raise ValueError(f"the {name} holds {problem}, which Postgres cannot store; remove it")
    if path is not None and (problem := path_problem(path)) is not None:
        raise ValueError(problem)
    if not is_text(content_type) or len(content_type) > 255:
        raise ValueError(f"content_type must be a text/* type or application/json, not {content_type!r}")
    stream = Stream.objects.using(using or conf.database()).create(
        owner=owner, label=label, metadata=metadata or {}, path=path, content_type=content_type
    )
    contents.kinds.remember([(stream.id, content_type)])
    return stream


@overload
def write(stream_id: Any, data: str, *, using: str | None = None, synchronous_commit: str | None = None) -> int: ...
@overload
def write(
    stream_id: Any,
    data: str,
    *,
    producer: Producer | None,
    using: str | None = None,
    synchronous_commit: str | None = None,
) -> int | None: ...
def write(
    stream_id: Any,
    data: str,
    *,
    producer: Producer | None = None,
    using: str | None = None,
    synchronous_commit: str | None = None,
) -> int | None:
    """Append ``data`` to a stream in one round trip and return its offset.

    Inside ``transaction.atomic()`` the chunk is visible, and announced, only after commit.

    Args:
        producer: ``pgstreams.Producer(id, epoch, seq)`` makes the write idempotent: a write
            retried with the same three (after a lost answer) returns None instead of storing
            the chunk twice (see ``producers``). Two round trips more.
        synchronous_commit: how long the commit waits ("off", "local", "remote_write", "on",
            "remote_apply"); defaults to ``PGSTREAMS['SYNCHRONOUS_COMMIT']``, else the server's
            setting. Inside ``transaction.atomic()`` the commit waits at the strongest level that
            any pgstreams write in the transaction asked for.

    Raises:
        StreamNotFound (also for a stream deleted or past its expiry), StreamClosed,
        ChunkTooLarge; InvalidChunk (also for a chunk the stream's content type cannot hold: not
        one JSON value in an ``application/json`` stream, any text in a stream of bytes);
        ProducerFenced, ProducerGap; TypeError for non-str data; ValueError for an unknown
        synchronous_commit or a bad producer.
    """
    sid = stream_uuid(stream_id)
    check_chunk(data, conf.max_chunk_bytes())
    level = _level(synchronous_commit)
    alias = using or conf.database()
    _check_contents(alias, sid, [data])
    mode = conf.notify_mode()
    rows = _execute_once(producer, "write", alias, mode, level, {"id": sid, "data": data})
    if rows is None:
        return None
    offset: int = rows[0][0]
    after_commit(alias, mode, Mark(sid, offset + 1, False), 1)
    return offset


def write_many(
    stream_id: Any,
    items: list[str],
    *,
    producer: Producer | None = None,
    using: str | None = None,
    synchronous_commit: str | None = None,
) -> list[int]:
    """Append several chunks in one statement and return their offsets, in order.

    Every item is checked before the database is touched: one bad item writes nothing.
    ``producer`` and ``synchronous_commit`` as for ``write()``; a batch written already returns [].
    """
    sid = stream_uuid(stream_id)
    if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
        raise TypeError(f"items must be a list of str, not {type(items).__name__}")
    items = list(items)
    limit = conf.max_chunk_bytes()
    for data in items:
        check_chunk(data, limit)
    level = _level(synchronous_commit)
    if not items:
        return []
    alias = using or conf.database()
    _check_contents(alias, sid, items)
    mode = conf.notify_mode()
    rows = _execute_once(producer, "write_many", alias, mode, level, {"id": sid, "n": len(items), "items": items})
    if rows is None:
        return []
    offsets = sorted(row[0] for row in rows)
    after_commit(alias, mode, Mark(sid, offsets[-1] + 1, False), len(offsets))
    return offsets


def _execute_once(
    producer: Producer | None, kind: str, alias: str, mode: str, level: str | None, params: dict[str, Any]
) -> list[tuple[Any, ...]] | None:
    """``_execute``, and with a producer only if its batch is not written yet (None if it is),
    recording the batch in the same transaction."""
    if producer is None:
        return _execute(kind, alias, mode, level, params)
    producer = producers.checked(producer)
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT {_GONE} FROM pgstreams_stream WHERE id = %s FOR NO KEY UPDATE", [params["id"]])
        found = cursor.fetchone()
        if found is None or found[0]:  # judged before the producer's batch, as the append path does
            raise StreamNotFound(f"no stream {params['id']} in database {alias!r}")
        if producers.check(cursor, params["id"], producer) is not None:
            return None
        rows = _execute(kind, alias, mode, level, params)
        producers.save(cursor, params["id"], producer)
    return rows


def close(stream_id: Any, *, using: str | None = None, synchronous_commit: str | None = None) -> int:
    """Close a stream: it takes no more writes, and its readers end once they have read it all.

    Returns the number of chunks it holds. Raises StreamNotFound (also for a stream deleted or
    past its expiry), or StreamClosed if it was already closed. ``synchronous_commit`` as for
    ``write()``.
    """
    sid = stream_uuid(stream_id)
    level = _level(synchronous_commit)
    alias = using or conf.database()
    mode = conf.notify_mode()
    next_offset: int = _execute("close", alias, mode, level, {"id": sid})[0][0]
    after_commit(alias, mode, Mark(sid, next_offset, True), 0)
    return next_offset


# The async twins run on pgstreams' own threads: concurrent writes do not queue behind each
# other, nor behind the process's other sync work.
acreate_stream = threads.writes.wrap(create_stream)
awrite = threads.writes.wrap(write)
awrite_many = threads.writes.wrap(write_many)
aclose = threads.writes.wrap(close)
