"""The appender: one named daemon thread per process and database alias that commits the append
path's items (``append``'s calls, stream writers' chunks and closes, the Durable Streams
endpoint's appends and creates) in batches across streams and callers, and hands each caller its
result. An item accepted by ``submit()`` is always settled: the thread ends only once it is
stopped with nothing queued, decided under the lock ``submit()`` and ``stop()`` take.

An append is not part of the caller's transaction. It waits in the appender's queue with the
appends of every thread and event loop of the process; the appender commits them together on a
connection of its own, one transaction per batch (``batch`` judges and writes one), and each
caller learns its result once its batch has committed, waiting without a thread if it is async. A
stream whose row another transaction holds (or wrote since the batch read it) is never waited on:
its appends wait for a later batch, for at most QUERY_TIMEOUT, then fail. A batch that certainly
did not commit (the connection failed before the commit was sent, or the server answered it with
an error) is sent again, in halves, within a retry budget of CONNECT_TIMEOUT + QUERY_TIMEOUT; when
the commit got no answer, ``resolution`` asks the database whether it committed: a batch is never
applied twice, and a caller gets an error only when its chunk was not committed
(``OutcomeUnknown`` when nobody can tell).

Each append is judged on its own inside its batch: a closed or unknown stream, a chunk its
content type cannot hold, an idempotent producer's duplicate, old epoch or gap, fail (or answer)
only their own call; a batch the database refuses for a value or a constraint (SQLSTATE classes 22
and 23) is split until the refused item stands alone. A stream writer's chunks wait as one item
until the appender takes it (``Sends``, ``extend``), so a busy appender gets fewer, larger items
and its cost per chunk falls as the load rises; such an item is split too, down to the refused
chunk. Once a chunk of a stream writer fails, its later ones and its close fail unsent, so a
stream never has a hole behind a chunk that committed after it, nor a close. This module never
reads chunks, and the callers' side (checking a chunk, waiting, a writer's flow control) is
``appends``'; notifications go out as NOTIFY_MODE says, once per batch, after the callers have
their results.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any, Final

import psycopg

from . import batch as batches
from . import conf, db, metrics, notify, resolution, writer
from .batch import DEFERRED, Chain, Item, NotJudged, Result, Sends, error
from .exceptions import OutcomeUnknown, StreamError
from .process import PerProcess
from .stats import AppenderStats

_random = random.Random()  # its own: the global state a project may seed is left alone
logger = logging.getLogger("pgstreams.appender")

# NOTIFY_MODE "per_write": the batch's notifications go out in its own transaction.
NOTIFY_SQL = "SELECT pg_notify(channel, payload) FROM unnest(%s::text[], %s::text[]) AS note(channel, payload)"

# The chunk data (characters of text, bytes) a batch takes at most, beside APPEND_BATCH's count,
# which alone would let chunks of MAX_CHUNK_BYTES make a statement of hundreds of MiB.
BATCH_BYTES: Final = 8 * 2**20


class _NotCommitted(Exception):
    """The batch's transaction certainly did not commit; it can be sent again."""


class Appender:
    """The append queue of one database alias in this process, and the named daemon thread that
    commits it in batches. ``submit()`` never blocks on the database."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self._queue: collections.deque[Item] = collections.deque()
        self._wake = threading.Event()
        self._lock = threading.Lock()  # guards _stopped against submit(), the thread's start and end, Sends.taken
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._deferred: list[Item] = []  # items whose streams were held, for the next batch (the thread's)
        self._crowded = False  # appends came while the last batch committed (the thread's)
        self.stats = AppenderStats()

    def submit(self, item: Item) -> None:
        with self._lock:
            if self._stopped:
                raise StreamError("the pgstreams appender of this process was stopped; append again")
            self._queue.append(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pgstreams-appender", daemon=True)
                self._thread.start()
        if not self._wake.is_set():  # set() takes a lock: skip it while a batch is already due
            self._wake.set()

    def extend(self, item: Sends, data: str) -> bool:
        """Add ``data`` to ``item``, submitted to this appender earlier, unless the appender has
        taken it or was stopped, or the item holds a batch's worth already (APPEND_BATCH chunks,
        BATCH_BYTES of data): then False, and the caller submits a new one."""
        with self._lock:
            if item.taken or self._stopped or len(item.gathered) >= conf.append_batch():
                return False
            if item.chars + len(data) > BATCH_BYTES:
                return False
            item.gathered.append(data)
            item.chars += len(data)
            return True

    async def asubmit(self, item: Item) -> Result:
        """Submit ``item`` (made with ``loop`` this event loop and an asyncio future) and wait for
        its result without holding a thread."""
        self.submit(item)
        return await item.future  # type: ignore[misc]

    def depth(self) -> int:
        return len(self._queue)

    def _run(self) -> None:
        last = 0.0
        while True:
            if not self._queue and not self._deferred:
                with self._lock:  # as submit() and stop() hold it: no item can come in between
                    if self._stopped and not self._queue:
                        break
                self._wake.wait()
                self._wake.clear()
                continue
            # The batch goes when the previous one has committed (we are here). If appends came
            # meanwhile, callers are many: it goes APPEND_INTERVAL after the previous one began,
            # so that commits stay few; if none did, a caller who waits for each append before
            # the next waits only for its commits. Items whose streams were held wait a random
            # part of an interval more: two processes' appenders on one stream, in step, would
            # otherwise meet at its lock on every try.
            wait = last + conf.append_interval() - time.monotonic() if self._crowded else 0.0
            if self._deferred:
                wait += _random.uniform(0.0, max(conf.append_interval(), 0.005))
                if not self._queue:  # woken early by a new item, not held up by one that waits
                    self._wake.wait(max(wait, 0.0))
                    self._wake.clear()
                    wait = 0.0
            if wait > 0:
                time.sleep(wait)
            last = time.monotonic()
            batch, self._deferred = self._deferred, []  # first, in order: they came first
            self._take(batch)
            deferred: list[Item] = []
            cpu = time.thread_time()
            try:
                self._commit(batch, deferred)
                self._defer(deferred)
            except Exception as exc:  # a bug must not leave callers waiting, nor kill the thread
                logger.exception("pgstreams: the appender failed on a batch of %d", len(batch))
                self._close()  # it may be inside the batch's transaction
                _settle(batch, [StreamError(f"append failed: {exc}") for _ in batch])
            self.stats.cpu_seconds += time.thread_time() - cpu
        self._close()

    def _take(self, batch: list[Item]) -> None:
        """Add queued items to ``batch`` while their chunks stay within APPEND_BATCH and their
        data within BATCH_BYTES (one at least), beside the deferred items it holds already. A
        stream writer's ``Sends`` takes no more chunks once it is looked at here."""
        room, space = conf.append_batch(), BATCH_BYTES
        queue = self._queue
        taken = False
        while queue:
            item = queue[0]
            if type(item) is Sends:
                with self._lock:  # its size stays as it is from here on
                    item.taken = True
            size, data_size = item.size, item.data_size
            if taken and (size > room or data_size > space):
                break
            batch.append(queue.popleft())
            room, space, taken = room - size, space - data_size, True

    def _commit(self, batch: list[Item], deferred: list[Item], deadline: float | None = None) -> None:
        """Commit ``batch`` and settle every item: its result, or why it was not written; an item
        whose stream another transaction holds, or wrote since it was read, goes to ``deferred``
        instead, in order, and with it the later items of its stream. An item of a stream writer
        whose earlier item failed fails too, unsent. A batch that did not commit is sent again in
        halves, in order, until ``deadline`` (the retry budget from now, by default): a shorter
        transaction may pass where the connection keeps failing. A stream writer's gathered
        chunks are cut in halves too when they stand alone (``_halves``)."""
        batch = _without_broken_chains(batch)
        if not batch:
            return
        mode = conf.notify_mode()  # once: the NOTIFY in the transaction and the one after agree
        held = frozenset(item.stream_id for item in deferred)  # by an earlier part of a split batch
        if deadline is None:
            deadline = time.monotonic() + conf.connect_timeout() + conf.query_timeout()
        backoff = db.Backoff()
        while True:
            try:
                outcome = self._transaction(batch, mode, held)
                break
            except _NotCommitted as exc:
                cause = exc.__cause__ or exc
                self.stats.retries += 1
                if time.monotonic() >= deadline:
                    _settle(batch, _not_committed(batch, cause))
                    return
                logger.warning("pgstreams: an append batch did not commit, sending it again: %s", cause)
                time.sleep(backoff.next())
                if (halves := _halves(batch)) is not None:
                    self._commit(halves[0], deferred, deadline)
                    if time.monotonic() < deadline:
                        self._commit(halves[1], deferred, deadline)
                    else:  # no try past the budget: the server may take CONNECT_TIMEOUT to refuse each
                        rest = _without_broken_chains(halves[1])
                        _settle(rest, _not_committed(rest, cause))
                    return
            except psycopg.DatabaseError as exc:  # an item the database refuses
                if (halves := _halves(batch)) is None:
                    _settle(batch, [error(StreamError, f"append refused by the database: {exc}", exc)])
                    return
                self.stats.splits += 1
                self._commit(halves[0], deferred)
                self._commit(halves[1], deferred)
                return
        self._crowded = bool(self._queue)  # before its callers know, and append again
        _settle(batch, outcome.results)
        deferred += outcome.deferred
        if not outcome.marks:
            return
        try:  # after the callers know: a failure here must not turn a commit into an error
            writer.committed(mode, outcome.marks, outcome.written)
            writer.announce_closed(self.alias, outcome.closed)
        except Exception:
            logger.exception("pgstreams: could not announce an append batch; readers' polling will")

    def _defer(self, items: list[Item]) -> None:
        """Keep the items whose streams another transaction held (or wrote) for the next batch, in order;
        those that have waited QUERY_TIMEOUT fail."""
        now = time.monotonic()
        late: list[Item] = []
        for item in items:
            if item.waits_until is None:
                item.waits_until = now + conf.query_timeout()
            if now >= item.waits_until:
                late.append(item)
            else:
                self._deferred.append(item)
        if late:
            _settle(late, [item.held() for item in late])

    def _transaction(self, batch: list[Item], mode: str, held: frozenset[uuid.UUID]) -> batches.Outcome:
        """One try at committing ``batch`` (the items of ``held`` streams deferred): its outcome
        (OutcomeUnknown for every item when nobody can tell). Raises _NotCommitted when the batch
        certainly did not commit and may be sent again, and the DatabaseError the database
        refused an item with."""
        began = time.monotonic()
        try:
            conn = self._connection()
            with db.watched(conn, "appending a batch"):
                conn.execute(db.begin_bounded_sql())  # a stopped process holds its rows no longer
                outcome = batches.run(conn, batch, conf.synchronous_commit(), conf.prepared_statements(), held)
                if outcome.marks and mode == "per_write":
                    conn.execute(NOTIFY_SQL, notify.notes(outcome.marks))
        except psycopg.Error as exc:
            refused = _refused(exc, self._conn)
            self._after_failure(self._conn)
            if refused:
                raise
            raise _NotCommitted() from exc
        try:
            with db.watched(conn, "committing an append batch"):
                conn.execute("COMMIT")
        except psycopg.Error as exc:
            if not conn.broken:  # the server answered: the transaction did not commit
                self._after_failure(conn)
                raise _NotCommitted() from exc
            self._after_failure(conn)
            if outcome.xid is None:
                raise _NotCommitted() from exc  # it wrote nothing: sending it again is harmless
            left = resolution.traces(batch, outcome)
            committed = resolution.committed(
                self._connection, self._close, outcome.xid, outcome.pid, outcome.places, exc, left
            )
            if committed is None:
                unknown = f"the connection failed while committing an append batch (transaction {outcome.xid}): {exc}"
                outcome.results = [
                    r if r is DEFERRED or isinstance(r, NotJudged) else error(OutcomeUnknown, unknown, exc)
                    for r in outcome.results
                ]
                outcome.marks = outcome.closed = []
                return outcome
            if not committed:
                raise _NotCommitted() from exc
            self.stats.resolved += 1
        settled = sum(item.size for item in batch) - sum(item.size for item in outcome.deferred)
        self.stats.batches += 1
        self.stats.appended += settled
        metrics.append_seconds.observe(time.monotonic() - began)
        metrics.append_batch.observe(settled)
        return outcome

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


def _without_broken_chains(batch: list[Item]) -> list[Item]:
    """``batch`` less the items of stream writers whose earlier item failed, which fail now."""
    kept, broken, failures = [], [], []
    for item in batch:
        failure = item.chain.failure if item.chain is not None else None
        if failure is None:
            kept.append(item)
        else:
            broken.append(item)
            failures.append(error(StreamError, f"an earlier chunk of this writer failed: {failure}", failure))
    if broken:
        _settle(broken, failures)
    return kept


def _halves(batch: list[Item]) -> tuple[list[Item], list[Item]] | None:
    """``batch`` cut in two, in order, to send again: its items, or a stream writer's gathered
    chunks when they are all it holds; None for a lone item that cannot be cut."""
    if len(batch) > 1:
        half = len(batch) // 2
        return batch[:half], batch[half:]
    (item,) = batch
    if type(item) is Sends and item.size > 1:
        first, second = item.halves()
        return [first], [second]
    return None


def _not_committed(batch: Sequence[Item], cause: BaseException) -> list[Exception]:
    """Each item's error when its batch could not be committed within the retry budget."""
    return [error(StreamError, f"append not committed: {cause}", cause) for _ in batch]


def _refused(exc: psycopg.Error, conn: psycopg.Connection[Any] | None) -> bool:
    """Whether the database refused an item of the batch (a value it cannot take, a constraint
    it breaks), on a connection that still works; anything else may pass when sent again."""
    sqlstate = getattr(exc, "sqlstate", None) or ""
    return conn is not None and not conn.broken and sqlstate[:2] in ("22", "23")


def _settle(batch: Sequence[Item], results: Sequence[Result]) -> None:
    """Hand each caller its result (none to those DEFERRED): thread futures at once, each event
    loop's futures and stream writers' counts in one callback."""
    by_loop: dict[asyncio.AbstractEventLoop, tuple[list[tuple[Any, Result]], dict[Chain, int]]] = {}
    for item, result in zip(batch, results, strict=True):
        if result is DEFERRED:
            continue
        chain = item.chain
        if chain is not None and item.future is None and chain.failure is None and isinstance(result, BaseException):
            chain.failure = result  # a chunk's; the close, last of its chain, has a future to say why it failed
        if item.loop is None:
            _set(item.future, result)
            continue
        pairs, chains = by_loop.get(item.loop) or by_loop.setdefault(item.loop, ([], {}))
        if item.future is not None:
            pairs.append((item.future, result))
        elif chain is not None:
            chains[chain] = chains.get(chain, 0) + item.size
    for loop, (pairs, chains) in by_loop.items():
        try:
            loop.call_soon_threadsafe(_set_all, pairs, chains)
        except RuntimeError:  # the loop was closed: nobody waits there any more
            pass


def _set_all(pairs: list[tuple[Any, Result]], chains: dict[Chain, int]) -> None:
    for future, result in pairs:
        _set(future, result)
    for chain, count in chains.items():
        chain.settled(count)


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
