"""The append path: ``append``, ``aappend`` and ``stream_writer``, committed in batches across
streams by one appender thread per process and database alias.

An append is not part of the caller's transaction. It waits in the appender's queue with the
appends of every thread and event loop of the process; the appender commits them together on a
connection of its own, one transaction per batch, and each call returns once its batch has
committed. One statement takes the counters of all the batch's streams (locked in id order, so
appenders of different processes never deadlock each other) and inserts every chunk, in call
order per stream. A batch that certainly did not commit (the connection failed before the
commit was sent, or the server answered it with an error) is sent again, within a retry budget
of CONNECT_TIMEOUT + QUERY_TIMEOUT. When the commit got no answer, the appender asks the
database whether a chunk the batch gave one of its streams is there with the batch's transaction
as its inserter (or, when every stream of the batch has gone since, the transaction's status),
ending the old backend first if it still runs: a batch is never applied twice, and a caller gets
an error only when its chunk was not committed (``OutcomeUnknown`` when nobody can tell).

A closed or unknown stream fails only its own appends; a batch the database refuses for a value
or a constraint (SQLSTATE classes 22 and 23) is split until the refused item stands alone. Once
an item of a stream writer fails, its later items fail unsent, so a stream never has a hole
behind a chunk that committed after it. This module never reads chunks; notifications go out as
NOTIFY_MODE says, once per batch, after the callers have their results.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Final

import psycopg
import psycopg.errors

from . import conf, contents, db, metrics, notify, writer
from .exceptions import InvalidChunk, OutcomeUnknown, StreamClosed, StreamError, StreamNotFound
from .process import PerProcess
from .stats import AppenderStats
from .types import Mark, stream_uuid

logger = logging.getLogger("pgstreams.appender")

# One statement per batch. ``locked`` takes the row lock of every open stream of the batch in id
# order and reads its counter as the lock left it; each stream's chunks get the offsets that
# follow it, in the order the batch lists them. Streams missing from the result are closed or
# unknown. The commit waits at SYNCHRONOUS_COMMIT (or the server's level), set for this
# transaction only.
APPEND_SQL = """
WITH items AS (
    SELECT t.stream_id, t.data, t.i
    FROM unnest(%(ids)b::uuid[], %(data)b::text[]) WITH ORDINALITY AS t(stream_id, data, i)
),
counts AS (
    SELECT stream_id, count(*) AS n FROM items GROUP BY stream_id
),
locked AS (
    SELECT s.id, s.next_offset AS base, c.n
    FROM pgstreams_stream AS s JOIN counts AS c ON c.stream_id = s.id
    WHERE s.closed_at IS NULL
    ORDER BY s.id
    FOR NO KEY UPDATE OF s
),
moved AS (
    UPDATE pgstreams_stream AS s
    SET next_offset = l.base + l.n, used_at = CASE WHEN s.ttl IS NULL THEN s.used_at ELSE clock_timestamp() END
    FROM locked AS l WHERE s.id = l.id
),
written AS (
    INSERT INTO pgstreams_chunk (stream_id, "offset", data, created_at)
    SELECT i.stream_id, l.base + row_number() OVER (PARTITION BY i.stream_id ORDER BY i.i) - 1, i.data, now()
    FROM items AS i JOIN locked AS l ON l.id = i.stream_id
)
SELECT l.id, l.base, pg_current_xact_id()::text, pg_backend_pid(),
       set_config('synchronous_commit', coalesce(%(level)s, current_setting('synchronous_commit')), true)
FROM locked AS l
"""

# NOTIFY_MODE "per_write": the batch's notifications go out in its own transaction.
NOTIFY_SQL = "SELECT pg_notify(%s, payload) FROM unnest(%s::text[]) AS payload"
STATE_SQL = "SELECT id, closed_at FROM pgstreams_stream WHERE id = ANY(%s)"
STATUS_SQL = "SELECT pg_xact_status(%s::xid8)"
# The inserters of the chunks at the places a batch gave its streams' first chunks: 32-bit
# transaction ids.
INSERTERS_SQL = (
    'SELECT xmin::text FROM pgstreams_chunk WHERE (stream_id, "offset") IN'
    " (SELECT * FROM unnest(%s::uuid[], %s::bigint[]))"
)
# Waits (up to the given milliseconds) for the backend to exit, so its transaction has ended.
TERMINATE_SQL = "SELECT pg_terminate_backend(%s, %s)"

# Chunks a stream writer may have sent and not yet seen committed before send() waits.
WRITER_IN_FLIGHT: Final = 1000

Result = int | BaseException


class _Chain:
    """The items of one stream writer: once one of them fails, the later ones fail with it
    instead of committing after it (a stream with a hole in the middle would look whole)."""

    __slots__ = ("failure",)

    def __init__(self) -> None:
        self.failure: BaseException | None = None


class _Item:
    """One append: where it goes, the future its caller waits on (in ``loop``, or None: a
    thread's), and the stream writer's chain it belongs to, if any."""

    __slots__ = ("stream_id", "data", "future", "loop", "chain")

    def __init__(
        self,
        stream_id: uuid.UUID,
        data: str,
        future: asyncio.Future[int] | concurrent.futures.Future[int],
        loop: asyncio.AbstractEventLoop | None,
        chain: _Chain | None = None,
    ) -> None:
        self.stream_id, self.data, self.future, self.loop, self.chain = stream_id, data, future, loop, chain


class _NotCommitted(Exception):
    """The batch's transaction certainly did not commit; it can be sent again."""


class _Misfits(Exception):
    """Items their streams' content types cannot hold (``contents``), and the items of the same
    stream writers after them: they fail, and the batch is sent again without them."""

    def __init__(self, items: list[_Item], errors: list[Exception]) -> None:
        super().__init__(f"{len(items)} item(s) their streams cannot hold")
        self.items, self.errors = items, errors


class Appender:
    """The append queue of one database alias in this process, and the named daemon thread that
    commits it in batches. ``submit()`` never blocks on the database."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self._queue: collections.deque[_Item] = collections.deque()
        self._wake = threading.Event()
        self._lock = threading.Lock()  # guards _stopped against submit(), and the thread's start
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self.stats = AppenderStats()

    def submit(self, item: _Item) -> None:
        with self._lock:
            if self._stopped:
                raise StreamError("the pgstreams appender of this process was stopped; append again")
            self._queue.append(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pgstreams-appender", daemon=True)
                self._thread.start()
        if not self._wake.is_set():  # set() takes a lock: skip it while a batch is already due
            self._wake.set()

    def depth(self) -> int:
        return len(self._queue)

    def _run(self) -> None:
        last = 0.0
        while True:
            if not self._queue:
                if self._stopped:
                    break
                self._wake.wait()
                self._wake.clear()
                continue
            # The batch goes when the previous one has committed (we are here) or APPEND_INTERVAL
            # after it began, whichever is later: with many callers, commits stay few.
            wait = last + conf.append_interval() - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            last = time.monotonic()
            size = min(len(self._queue), conf.append_batch())
            batch = [self._queue.popleft() for _ in range(size)]
            try:
                self._commit(batch)
            except Exception as exc:  # a bug must not leave callers waiting, nor kill the thread
                logger.exception("pgstreams: the appender failed on a batch of %d", len(batch))
                self._close()  # it may be inside the batch's transaction
                _settle(batch, [StreamError(f"append failed: {exc}") for _ in batch])
        self._close()

    def _commit(self, batch: list[_Item]) -> None:
        """Commit ``batch`` and settle every item: its offset, or why it was not written. An
        item of a stream writer whose earlier item failed fails too, unsent."""
        batch = _without_broken_chains(batch)
        if not batch:
            return
        mode = conf.notify_mode()  # once: the NOTIFY in the transaction and the one after agree
        deadline = time.monotonic() + conf.connect_timeout() + conf.query_timeout()
        backoff = db.Backoff()
        while True:
            try:
                results, marks = self._transaction(batch, mode)
                break
            except _Misfits as misfits:  # rare: fail them, and send the others without them
                _settle(misfits.items, misfits.errors)
                batch = [item for item in batch if item not in misfits.items]
                if not batch:
                    return
            except _NotCommitted as exc:
                cause = exc.__cause__ or exc
                self.stats.retries += 1
                if time.monotonic() >= deadline:
                    results = [_error(StreamError, f"append not committed: {cause}", cause) for _ in batch]
                    marks = []
                    break
                logger.warning("pgstreams: an append batch did not commit, sending it again: %s", cause)
                time.sleep(backoff.next())
            except psycopg.DatabaseError as exc:  # an item the database refuses
                if len(batch) == 1:
                    results, marks = [_error(StreamError, f"append refused by the database: {exc}", exc)], []
                    break
                self.stats.splits += 1
                half = len(batch) // 2
                self._commit(batch[:half])
                self._commit(batch[half:])
                return
        _settle(batch, results)
        if not marks:
            return
        try:  # after the callers know: a failure here must not turn a commit into an error
            writer.committed(mode, marks, sum(isinstance(r, int) for r in results))
        except Exception:
            logger.exception("pgstreams: could not announce an append batch; readers' polling will")

    def _transaction(self, batch: list[_Item], mode: str) -> tuple[list[Result], list[Mark]]:
        """One try at committing ``batch``: each item's result (OutcomeUnknown for all when
        nobody can tell) and the marks of the streams written. Raises _NotCommitted when the
        batch certainly did not commit and may be sent again, and the DatabaseError the
        database refused an item with."""
        began = time.monotonic()
        try:
            conn = self._connection()
            with db.watched(conn, "appending a batch"):
                conn.execute("BEGIN")
                _check_contents(conn, batch)
                ids, data = [item.stream_id for item in batch], [item.data for item in batch]
                params = {"ids": ids, "data": data, "level": conf.synchronous_commit()}
                # Prepared (once per connection) where PREPARED_STATEMENTS allows: planning the
                # statement would cost as much as running it on a small batch.
                rows = conn.execute(APPEND_SQL, params, prepare=conf.prepared_statements()).fetchall()
                offsets, marks = _offsets(batch, rows)
                unwritten = [item.stream_id for item, offset in zip(batch, offsets, strict=True) if offset is None]
                states = dict(conn.execute(STATE_SQL, [unwritten]).fetchall()) if unwritten else {}
                if marks and mode == "per_write":
                    conn.execute(NOTIFY_SQL, (conf.channel(), notify.pack(marks)))
        except _Misfits:
            self._after_failure(self._conn)
            raise
        except psycopg.Error as exc:
            refused = _refused(exc, self._conn)
            self._after_failure(self._conn)
            if refused:
                raise
            raise _NotCommitted() from exc
        results = _results(batch, offsets, states, self.alias)
        try:
            with db.watched(conn, "committing an append batch"):
                conn.execute("COMMIT")
        except psycopg.Error as exc:
            if not conn.broken:  # the server answered: the transaction did not commit
                self._after_failure(conn)
                raise _NotCommitted() from exc
            self._after_failure(conn)
            if not rows:
                raise _NotCommitted() from exc  # it wrote nothing: sending it again is harmless
            committed = self._resolve(rows, exc)
            if committed is None:
                unknown = f"the connection failed while committing an append batch (transaction {rows[0][2]}): {exc}"
                return [_error(OutcomeUnknown, unknown, exc) for _ in batch], []
            if not committed:
                raise _NotCommitted() from exc
            self.stats.resolved += 1
        self.stats.batches += 1
        self.stats.appended += len(batch)
        metrics.append_seconds.observe(time.monotonic() - began)
        metrics.append_batch.observe(len(batch))
        return results, marks

    def _resolve(self, rows: list[tuple[Any, ...]], failure: Exception) -> bool | None:
        """Whether the batch of APPEND_SQL's ``rows``, whose commit got no answer, committed:
        True, False, or None if no connection could tell within the retry budget.

        It committed if the first chunk it gave any of its streams is there with the batch's
        transaction as its inserter (``xmin``), a fact no later transaction can fake, even one
        that reuses the id after a crash; it did not if other transactions' chunks hold those
        places. If none of them is there (every stream of the batch was deleted, pruned or
        expired since), the transaction's own status tells. Before concluding, a transaction
        still in progress (its backend has not noticed the lost client) is ended by ending its
        backend."""
        xid, pid = rows[0][2], rows[0][3]
        places = [[row[0] for row in rows], [row[1] for row in rows]]
        deadline = time.monotonic() + conf.connect_timeout() + conf.query_timeout()
        backoff = db.Backoff()
        while True:
            try:
                conn = self._connection()
                with db.watched(conn, "asking whether an append batch committed"):
                    inserters = {int(x) for (x,) in conn.execute(INSERTERS_SQL, places).fetchall()}
                    if int(xid) % 2**32 in inserters:
                        committed = True
                    elif (status := _status(conn, xid)) == "in progress":
                        conn.execute(TERMINATE_SQL, [pid, int(conf.query_timeout() * 1000 / 2)])
                        continue  # ask again, now that it has ended
                    else:
                        committed = not inserters and status == "committed"
                logger.warning(
                    "pgstreams: an append batch's commit got no answer (%s); it %s",
                    failure,
                    "committed" if committed else "did not commit",
                )
                return committed
            except psycopg.Error:
                self._after_failure(self._conn)
            if time.monotonic() >= deadline:
                return None
            time.sleep(backoff.next())

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = db.connect(self.alias, "appender")
        return self._conn

    def _after_failure(self, conn: psycopg.Connection[Any] | None) -> None:
        """Drop a connection that failed; roll back one that is still usable."""
        if conn is None:
            return
        if conn.broken or conn.closed:
            self._close()
            return
        try:
            conn.execute("ROLLBACK")
        except psycopg.Error:
            self._close()

    def stop(self, timeout: float | None = None) -> None:
        """Commit what is queued, then stop the thread; a later ``submit()`` raises StreamError.
        Waits at most ``timeout`` seconds (by default a batch's retry budget and its resolution);
        a thread still busy then is left behind, as a daemon, with a warning."""
        with self._lock:
            self._stopped = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            budget = 2 * (conf.connect_timeout() + conf.query_timeout()) + conf.query_timeout() + 1
            thread.join(budget if timeout is None else timeout)
            if thread.is_alive():
                logger.warning("pgstreams: appender thread did not stop in time")
                return
        self._close()

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            db.close_blocking_quietly(conn)


def _status(conn: psycopg.Connection[Any], xid: str) -> str | None:
    """Transaction ``xid``'s status: "in progress", "committed", "aborted", or None for one too old
    to tell or that the server has not reached (it restarted from a WAL that never saw it, or
    another server took over)."""
    try:
        row = conn.execute(STATUS_SQL, [xid]).fetchone()
    except psycopg.errors.InvalidParameterValue:
        return None
    return None if row is None else row[0]


def _check_contents(conn: psycopg.Connection[Any], batch: list[_Item]) -> None:
    """Raise _Misfits for the items their streams' content types cannot hold; the content types
    of streams this process has not met yet are read first (an unknown stream is left to the
    batch's statement, which reports it)."""
    unknown = {item.stream_id for item in batch if contents.kinds.get(item.stream_id) is None}
    if unknown:
        contents.kinds.remember(conn.execute(contents.LOOKUP_SQL, [list(unknown)]).fetchall())
    misfits: list[_Item] = []
    errors: list[Exception] = []
    broken: dict[_Chain, Exception] = {}  # stream writers with a misfit earlier in the batch
    for item in batch:
        if item.chain is not None and item.chain in broken:
            misfits.append(item)
            cause = broken[item.chain]
            errors.append(_error(StreamError, f"an earlier chunk of this writer failed: {cause}", cause))
            continue
        kind = contents.kinds.get(item.stream_id)
        if kind is None:
            continue
        try:
            contents.check_fits(kind, item.data, item.stream_id)
        except InvalidChunk as exc:
            misfits.append(item)
            errors.append(exc)
            if item.chain is not None:
                broken[item.chain] = exc
    if misfits:
        raise _Misfits(misfits, errors)


def _without_broken_chains(batch: list[_Item]) -> list[_Item]:
    """``batch`` less the items of stream writers whose earlier item failed, which fail now."""
    kept, broken, failures = [], [], []
    for item in batch:
        failure = item.chain.failure if item.chain is not None else None
        if failure is None:
            kept.append(item)
        else:
            broken.append(item)
            failures.append(_error(StreamError, f"an earlier chunk of this writer failed: {failure}", failure))
    if broken:
        _settle(broken, failures)
    return kept


def _refused(exc: psycopg.Error, conn: psycopg.Connection[Any] | None) -> bool:
    """Whether the database refused an item of the batch (a value it cannot take, a constraint
    it breaks), on a connection that still works; anything else may pass when sent again."""
    sqlstate = getattr(exc, "sqlstate", None) or ""
    return conn is not None and not conn.broken and sqlstate[:2] in ("22", "23")


def _error(kind: type[Exception], message: str, cause: BaseException) -> Exception:
    error = kind(message)
    error.__cause__ = cause
    return error


def _offsets(batch: list[_Item], rows: list[tuple[Any, ...]]) -> tuple[list[int | None], list[Mark]]:
    """Each item's offset (its stream's base plus the items of that stream before it; None for a
    stream the batch did not write) and each written stream's mark. Streams are keyed by their
    ``int``: a UUID's own hash is computed in Python."""
    following = {row[0].int: row[1] for row in rows}  # the offset the stream's next item gets
    offsets: list[int | None] = []
    for item in batch:
        key = item.stream_id.int
        offset = following.get(key)
        if offset is not None:
            following[key] = offset + 1
        offsets.append(offset)
    return offsets, [Mark(row[0], following[row[0].int], False) for row in rows]


def _results(batch: list[_Item], offsets: list[int | None], states: dict[uuid.UUID, Any], alias: str) -> list[Result]:
    """Each item's offset, or the error of a stream the batch could not write (``states``: the
    closed_at of those that exist)."""
    results: list[Result] = []
    for item, offset in zip(batch, offsets, strict=True):
        sid = item.stream_id
        if offset is not None:
            results.append(offset)
        elif states.get(sid) is not None:
            closed_at = states[sid].isoformat()
            results.append(StreamClosed(f"stream {sid} was closed at {closed_at}; create a new stream to write more"))
        elif sid in states:  # open, but not there when the batch's statement began
            results.append(StreamError(f"stream {sid} was not visible to the append; append again"))
        else:
            results.append(StreamNotFound(f"no stream {sid} in database {alias!r}"))
    return results


def _settle(batch: list[_Item], results: Sequence[Result]) -> None:
    """Hand each caller its result: thread futures at once, each event loop's in one callback."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Any, Result]]] = {}
    for item, result in zip(batch, results, strict=True):
        if isinstance(result, BaseException) and item.chain is not None and item.chain.failure is None:
            item.chain.failure = result
        if item.loop is None:
            _set(item.future, result)
        else:
            by_loop.setdefault(item.loop, []).append((item.future, result))
    for loop, pairs in by_loop.items():
        try:
            loop.call_soon_threadsafe(_set_all, pairs)
        except RuntimeError:  # the loop was closed: nobody waits there any more
            pass


def _set_all(pairs: list[tuple[Any, Result]]) -> None:
    for future, result in pairs:
        _set(future, result)


def _set(future: Any, result: Result) -> None:
    if future.done():  # an async caller that was cancelled
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


def _stop_all(appenders: dict[str, Appender]) -> None:
    for appender in list(appenders.values()):
        appender.stop()


_appenders: PerProcess[dict[str, Appender]] = PerProcess(dict, _stop_all)
stop_appenders = _appenders.stop  # commit what is queued and stop; the next append starts anew


def appender(alias: str) -> Appender:
    """This process's appender for ``alias``, made on first use."""
    appenders = _appenders.get()
    found = appenders.get(alias)
    return found if found is not None else appenders.setdefault(alias, Appender(alias))


def _prepare(stream_id: Any, data: str, using: str | None) -> tuple[uuid.UUID, Appender]:
    sid = stream_uuid(stream_id)
    writer.check_chunk(data, conf.max_chunk_bytes())
    return sid, appender(using or conf.database())


def append(stream_id: Any, data: str, *, using: str | None = None) -> int:
    """Append ``data`` to a stream and return its offset once it is committed.

    Not part of the caller's transaction: the chunk is committed (at ``SYNCHRONOUS_COMMIT``)
    together with the other appends of this process, whatever transaction the caller is in,
    and stays committed if that transaction rolls back. Use ``write()`` for a chunk that must
    commit or roll back with other changes.

    Raises:
        StreamNotFound, StreamClosed, ChunkTooLarge, InvalidChunk (also for a chunk the stream's
        content type cannot hold, as for ``write()``), each affecting only this call, never the
        other appends of its batch; TypeError for non-str data; OutcomeUnknown if the
        connection failed during the commit and the database could not be asked in time.
    """
    sid, target = _prepare(stream_id, data, using)
    future: concurrent.futures.Future[int] = concurrent.futures.Future()
    target.submit(_Item(sid, data, future, None))
    return future.result()


async def aappend(stream_id: Any, data: str, *, using: str | None = None) -> int:
    """``append()`` for async code: waits for the commit without holding the event loop or a
    thread. A cancelled call may still be committed."""
    sid, target = _prepare(stream_id, data, using)
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    target.submit(_Item(sid, data, future, loop))
    return await future


class StreamWriter:
    """Appends to one stream without waiting for each commit: ``send()`` queues a chunk and
    returns, ``flush()`` waits for everything sent and raises the first error. Chunks commit in
    the order they were sent. Make one with ``stream_writer()``."""

    def __init__(self, stream_id: Any, *, close: bool = False, using: str | None = None) -> None:
        self.stream_id = stream_uuid(stream_id)
        self._close = close
        self._alias = using or conf.database()
        self._pending: collections.deque[asyncio.Future[int]] = collections.deque()
        self._error: BaseException | None = None
        self._chain = _Chain()
        self.sent = 0

    async def send(self, data: str) -> None:
        """Queue ``data``; return at once, unless WRITER_IN_FLIGHT chunks wait for their commit
        (then wait for the oldest). Raises the first error of an earlier chunk, if one is known,
        so a loop stops writing to a stream that was closed under it."""
        self._collect()
        if self._error is not None:
            raise self._error
        writer.check_chunk(data, conf.max_chunk_bytes())
        if len(self._pending) >= WRITER_IN_FLIGHT:
            await asyncio.wait([self._pending[0]])
            self._collect()
            if self._error is not None:
                raise self._error
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        appender(self._alias).submit(_Item(self.stream_id, data, future, loop, self._chain))
        self._pending.append(future)
        self.sent += 1

    async def flush(self) -> None:
        """Wait until everything sent is committed; raise the first error if any chunk failed."""
        if self._pending:
            await asyncio.wait(list(self._pending))
        self._collect()
        if self._error is not None:
            raise self._error

    def _collect(self) -> None:
        while self._pending and self._pending[0].done():
            error = self._pending.popleft().exception()
            if error is not None and self._error is None:
                self._error = error

    async def __aenter__(self) -> StreamWriter:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.flush()
        finally:
            if self._close:
                try:
                    await writer.aclose(self.stream_id, using=self._alias)
                except StreamClosed:
                    if exc is None and self._error is None:
                        raise


def stream_writer(stream_id: Any, *, close: bool = False, using: str | None = None) -> StreamWriter:
    """A writer for a token loop: ``async with stream_writer(sid, close=True) as w: await w.send(t)``.

    ``send()`` queues without waiting for the commit (through the append path, so not part of
    any transaction); leaving the block waits for every chunk sent and raises the first error.
    With ``close=True`` the stream is closed on the way out, also when the block raises, so its
    readers are not left waiting.
    """
    return StreamWriter(stream_id, close=close, using=using)
