"""The per-process listener: one LISTEN connection, one fetch connection and the fallback poll,
shared by every reader, sync or async, in the process. With READ_DATABASE the fetch connection
goes to a standby, and a third one asks the primary about streams readers start on.

It runs an asyncio loop in one named daemon thread. For each stream that readers here follow it
keeps a ``Tail``: a bounded window of the chunks fetched last, and the highest offset announced.
Notifications, commits in this process and the poll only mark tails dirty; one query then fetches
the new chunks of every dirty tail together with each stream's state, in one snapshot, and wakes
the readers of the tails that moved. Readers never query the database themselves: a reader behind
the window asks for a page, and readers asking for the same page share one fetch.

Readers wait for "the tail has passed my offset", never for a flag another reader could clear.
Every query has QUERY_TIMEOUT to be answered, and a LISTEN connection silent for
LISTEN_CHECK_INTERVAL is checked with a query, so a connection whose peer vanished is replaced
within seconds. This module does not write to the database and does not know about the
notification buffer.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import datetime
import itertools
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import psycopg
from psycopg import sql

from . import conf, db, notify
from .exceptions import StreamError, StreamNotFound
from .stats import ListenerStats

logger = logging.getLogger("pgstreams.listener")

# Chunks fetched at most per stream and query.
PAGE_SIZE: Final = 500
# Pages fetched at most in one query (fewer after a query ran out of time: see _fetch_forever).
FETCH_KEYS: Final = 256
# A tail keeps at most this many chunks and characters of data (but always the last page).
WINDOW_CHUNKS: Final = 2048
WINDOW_CHARS: Final = 1 << 20
# Chunks handed to a reader at once.
BATCH: Final = 256
# Offsets are bigint: the highest one a stream can have.
MAX_OFFSET: Final = 2**63 - 1

# One snapshot gives each stream's state and the chunks from the wanted offset, so "closed, and
# next_offset is N" and "every chunk below N is here" are seen together.
FETCH_SQL = """
SELECT w.i, s.next_offset, s.closed_at IS NOT NULL, c."offset", c.data, c.created_at
FROM unnest(%s::uuid[], %s::bigint[]) WITH ORDINALITY AS w(stream_id, from_offset, i)
LEFT JOIN pgstreams_stream AS s ON s.id = w.stream_id
LEFT JOIN LATERAL (
    SELECT k."offset", k.data, k.created_at
    FROM pgstreams_chunk AS k
    WHERE k.stream_id = w.stream_id AND k."offset" >= w.from_offset
    ORDER BY k."offset"
    LIMIT %s
) AS c ON true
ORDER BY w.i, c."offset"
"""


# With READ_DATABASE: what the primary says of streams readers start on.
PRIMARY_STATE_SQL = "SELECT id, next_offset, closed_at IS NOT NULL FROM pgstreams_stream WHERE id = ANY(%s)"


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """One chunk as readers receive it."""

    stream_id: uuid.UUID
    offset: int
    data: str
    created_at: datetime.datetime


@dataclass(slots=True)
class Page:
    """What one fetch found for (stream, from_offset): the stream's state and its chunks from
    from_offset on, consecutive (a page stops before a gap)."""

    exists: bool
    next_offset: int = 0
    closed: bool = False
    chunks: list[StreamChunk] = field(default_factory=list)
    # Set when the chunk at from_offset is gone though the stream is past it (pruned): where
    # reading can resume, the next chunk still held or next_offset.
    pruned_to: int | None = None


class End:
    """Returned by ``Listener.step()`` when a reader has read all of a closed stream."""


END: Final = End()

Waiter = threading.Event | asyncio.Event
Step = list[StreamChunk] | End | concurrent.futures.Future | Waiter


@dataclass(slots=True, eq=False)
class Tail:
    """What this process knows of one followed stream."""

    stream_id: uuid.UUID
    readers: int = 0
    # window holds chunks start .. end-1; start is None until the first fetch.
    start: int | None = None
    end: int = 0
    window: list[StreamChunk] = field(default_factory=list)
    window_chars: int = 0
    hint: int = 0  # highest next_offset announced or seen
    close_hinted: bool = False
    final: int | None = None  # next_offset once the stream is known to be closed
    gone: bool = False  # the stream was deleted
    failure: StreamError | None = None  # the database refused to fetch this tail
    dirty: bool = False
    polled: bool = False
    waiters: dict[asyncio.AbstractEventLoop | None, Waiter] = field(default_factory=dict)

    def wants_fetch(self) -> bool:
        return self.hint > self.end or (self.close_hinted and self.final is None)

    def merge(self, from_offset: int, page: Page) -> bool:
        """Fold a page into the window; return whether readers have something new."""
        moved = False
        self.hint = max(self.hint, page.next_offset)
        if page.pruned_to is not None:
            if self.start is not None and from_offset == self.end:
                # The chunks after the window are gone: readers past it ask for their own pages
                # (and learn what was pruned); the window starts again from the next page.
                self.start, self.end, self.window, self.window_chars = None, 0, [], 0
                moved = True
            return moved
        if page.closed and self.final is None:
            self.final = page.next_offset
            moved = True
        chunks = page.chunks
        if self.start is None:
            if chunks:
                self.start, self.end = from_offset, from_offset + len(chunks)
                self._append(chunks)
                moved = True
            elif from_offset >= page.next_offset:
                self.start = self.end = page.next_offset
                moved = True
        elif chunks and from_offset <= self.end < from_offset + len(chunks):
            self._append(chunks[self.end - from_offset :])
            self.end = from_offset + len(chunks)
            moved = True
        return moved

    def _append(self, chunks: list[StreamChunk]) -> None:
        # Trim from the front to the size limits, but never below the page just added.
        self.window.extend(chunks)
        self.window_chars += sum(len(c.data) for c in chunks)
        drop, droppable = 0, len(self.window) - len(chunks)
        while drop < droppable and (len(self.window) - drop > WINDOW_CHUNKS or self.window_chars > WINDOW_CHARS):
            self.window_chars -= len(self.window[drop].data)
            drop += 1
        if drop:
            del self.window[:drop]
            assert self.start is not None
            self.start += drop


class Listener:
    """This process's listener; get it with ``get_listener()``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tails: dict[uuid.UUID, Tail] = {}
        self._requests: dict[tuple[uuid.UUID, int], list[concurrent.futures.Future[Page]]] = {}
        self._kicked = False
        self._behind_pending = False  # a _fetch_behind() is scheduled
        self._fetch_limit = FETCH_KEYS
        self._conns: set[psycopg.AsyncConnection[Any]] = set()  # open, severed at stop
        self._stopped = False
        self.stats = ListenerStats()
        self.listening = threading.Event()  # set while LISTEN is in effect
        self._loop = asyncio.new_event_loop()
        self._work = asyncio.Event()
        self._stopping = asyncio.Event()
        self._thread = threading.Thread(target=self._run, name="pgstreams-listener", daemon=True)
        self._thread.start()

    # -- the readers' side (any thread) --------------------------------------------------------

    def attach(self, stream_id: uuid.UUID) -> Tail:
        with self._lock:
            tail = self._tails.get(stream_id)
            if tail is None:
                tail = self._tails[stream_id] = Tail(stream_id)
            tail.readers += 1
            return tail

    def detach(self, tail: Tail) -> None:
        with self._lock:
            tail.readers -= 1
            if tail.readers <= 0 and self._tails.get(tail.stream_id) is tail:
                del self._tails[tail.stream_id]

    def step(self, tail: Tail, pos: int, loop: asyncio.AbstractEventLoop | None) -> Step:
        """What a reader at ``pos`` does next: take chunks, end, await a page, or wait.

        The wait object is registered under the same lock that guards every change to the tail,
        so a change after this call always sets it.
        """
        with self._lock:
            if self._stopped:
                raise StreamError("the pgstreams listener of this process was stopped; read again")
            if tail.gone:
                raise StreamNotFound(f"stream {tail.stream_id} was deleted while being read")
            start = tail.start
            if start is not None and start <= pos < tail.end:
                i = pos - start
                return tail.window[i : i + BATCH]
            if tail.failure is not None:
                raise StreamError(str(tail.failure)) from tail.failure.__cause__
            if tail.final is not None and pos >= tail.final:
                return END
            if start is None or pos < start:
                return self._request(tail.stream_id, pos)
            if tail.wants_fetch() and not tail.dirty:
                # More was announced than the window holds: fetch it now that a reader waits.
                tail.dirty = True
                self._kick()
            waiter = tail.waiters.get(loop)
            if waiter is None:
                waiter = tail.waiters[loop] = threading.Event() if loop is None else asyncio.Event()
            return waiter

    def _request(self, stream_id: uuid.UUID, pos: int) -> concurrent.futures.Future[Page]:
        future: concurrent.futures.Future[Page] = concurrent.futures.Future()
        self._requests.setdefault((stream_id, pos), []).append(future)
        self._kick()
        return future

    # -- announcements (any thread) ------------------------------------------------------------

    def announce(self, marks: list[notify.Mark]) -> None:
        """Note that streams reached these offsets; tails that fall behind are fetched."""
        with self._lock:
            for mark in marks:
                tail = self._tails.get(mark.stream_id)
                if tail is None:
                    continue
                tail.hint = max(tail.hint, mark.next_offset)
                tail.close_hinted |= mark.closed
                if tail.wants_fetch() and tail.start is not None:
                    tail.dirty = True
                    self._kick()

    def _kick(self) -> None:
        # Called with the lock held; coalesces wake-ups of the loop.
        if not self._kicked:
            self._kicked = True
            try:
                self._loop.call_soon_threadsafe(self._work.set)
            except RuntimeError:  # the loop is closed: the listener stopped
                pass

    # -- the loop (listener thread) ------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        except Exception:
            logger.exception("pgstreams: the listener thread failed")
        finally:
            self._shut()
            self._loop.close()

    async def _main(self) -> None:
        """Run the three loops until stop(); a loop that fails is logged and started again."""
        loops = {
            "pgstreams-listen": self._listen_forever,
            "pgstreams-fetch": self._fetch_forever,
            "pgstreams-poll": self._poll_forever,
        }
        tasks = {asyncio.create_task(run(), name=name): name for name, run in loops.items()}
        stopping = asyncio.create_task(self._stopping.wait())
        while not stopping.done():
            done, _ = await asyncio.wait([stopping, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in done - {stopping}:
                name = tasks.pop(task)
                if not task.cancelled():
                    logger.error("pgstreams: %s failed, restarting it", name, exc_info=task.exception())
                self.stats.restarts += 1
                self._work.set()  # whatever the failed loop was doing is done again
                tasks[asyncio.create_task(loops[name](), name=name)] = name
        for conn in self._conns:
            db.sever(conn)  # a query in flight fails now instead of waiting for a cancel to be answered
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _connect(self, alias: str, role: str) -> psycopg.AsyncConnection[Any]:
        conn = await db.aconnect(alias, role)
        self._conns.add(conn)
        return conn

    async def _disconnect(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conns.discard(conn)
        await _close_quietly(conn)

    async def _listen_forever(self) -> None:
        backoff = db.Backoff()
        connected_before = False
        while True:
            conn = None
            try:
                conn = await self._connect(conf.listen_database(), "listener")
                async with db.deadline(conn, "LISTEN"):
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(conf.channel())))
                if connected_before:
                    self.stats.reconnects += 1
                connected_before = True
                backoff.reset()
                self.listening.set()
                # Whatever was announced while nobody listened is fetched now.
                self._refetch_all()
                await self._hear(conn)
            except Exception as exc:  # a database blip must not end the loop
                self.stats.listen_errors += 1
                logger.warning("pgstreams: listener connection lost, reconnecting: %s", exc)
            finally:
                self.listening.clear()
                if conn is not None:
                    await self._disconnect(conn)
            # Notifications may have been missed: every followed stream is read again at once.
            self._refetch_all()
            await asyncio.sleep(backoff.next())

    async def _hear(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Announce what notifications say, until the connection fails. After
        LISTEN_CHECK_INTERVAL without one, a query proves the connection alive (or, unanswered
        within QUERY_TIMEOUT, fails it): a peer that vanished sends no error, only silence."""
        while True:
            heard = False
            async for note in conn.notifies(timeout=conf.listen_check_interval()):
                heard = True
                self.stats.notifications += 1
                self.announce(list(notify.decode(note.payload)))
            if not heard:
                async with db.deadline(conn, "checking the LISTEN connection"):
                    await conn.execute("SELECT 1")
                self.stats.listen_checks += 1

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(conf.poll_interval() * random.uniform(0.8, 1.2))
            with self._lock:
                for tail in self._tails.values():
                    tail.dirty = tail.polled = True
                followed = bool(self._tails)
            if followed:
                self.stats.polls += 1
                self._work.set()

    def _refetch_all(self) -> None:
        with self._lock:
            for tail in self._tails.values():
                tail.dirty = True
            self._work.set()

    async def _fetch_forever(self) -> None:
        backoff = db.Backoff()
        # While the read database is behind what was announced, ask it again at growing intervals.
        behind = db.Backoff(first=0.002, cap=0.1)
        conns = _FetchConnections(self._connect, self._disconnect)
        try:
            while True:
                await self._work.wait()
                self._work.clear()
                keys, polled = self._collect(self._fetch_limit)
                if not keys:
                    continue
                try:
                    waiting = await self._fetch_round(conns, keys, polled)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self.stats.fetch_errors += 1
                    logger.warning("pgstreams: fetching chunks failed, retrying: %s", exc)
                    if isinstance(exc, db.QueryTimeout):
                        # Too much for one deadline, perhaps (a backlog after a reconnect):
                        # fetch it in smaller rounds rather than run out of time again.
                        self._fetch_limit = max(1, len(keys) // 2)
                    await conns.close()
                    with self._lock:
                        for stream_id, _ in keys:
                            if stream_id in self._tails:
                                self._tails[stream_id].dirty = True
                    await asyncio.sleep(backoff.next())
                    self._work.set()
                    continue
                backoff.reset()
                self._fetch_limit = min(FETCH_KEYS, 2 * self._fetch_limit)
                if waiting:
                    self.stats.read_behind += 1
                    if not self._behind_pending:  # one retry pending at a time
                        self._behind_pending = True
                        self._loop.call_later(behind.next(), self._fetch_behind)
                else:
                    behind.reset()
        finally:
            await conns.close()

    async def _fetch_round(
        self, conns: _FetchConnections, keys: list[tuple[uuid.UUID, int]], polled: set[uuid.UUID]
    ) -> bool:
        """Fetch the pages of ``keys`` and deliver them (nothing here outlives the round);
        return whether a reader waits for chunks the read database does not show yet."""
        began = time.monotonic()
        pages = await self._fetch_pages(await conns.read(), keys)
        waiting = await self._confirm_on_primary(conns, keys, pages) if conns.standby else False
        self.stats.fetch_seconds += time.monotonic() - began
        self.stats.fetches += 1
        return self._deliver(pages, polled) or waiting

    async def _fetch_pages(
        self, conn: psycopg.AsyncConnection[Any], keys: list[tuple[uuid.UUID, int]]
    ) -> dict[tuple[uuid.UUID, int], Page]:
        """Fetch every key in one query. When the database refuses the query itself (not the
        connection: a value out of range, a row the client cannot load), fetch key by key, and
        fail only the readers of the keys refused alone."""
        try:
            return await _fetch(conn, keys)
        except psycopg.DatabaseError as exc:
            if not _refused(exc, conn):
                raise
            self.stats.fetch_errors += 1
            logger.warning(
                "pgstreams: the database refused a fetch of %d page(s), fetching them one by one: %s", len(keys), exc
            )
        pages: dict[tuple[uuid.UUID, int], Page] = {}
        for key in keys:
            try:
                pages.update(await _fetch(conn, [key]))
            except psycopg.DatabaseError as exc:
                if not _refused(exc, conn):
                    raise
                self._refuse(key, exc)
        return pages

    def _refuse(self, key: tuple[uuid.UUID, int], exc: Exception) -> None:
        """Fail the readers waiting for a page the database refuses to give; no one else."""
        stream_id, offset = key
        logger.warning("pgstreams: cannot read stream %s from offset %d: %s", stream_id, offset, exc)
        error = StreamError(f"reading stream {stream_id} from offset {offset} failed: {exc}")
        error.__cause__ = exc
        wake: list[tuple[asyncio.AbstractEventLoop | None, Waiter]] = []
        with self._lock:
            futures = self._requests.pop(key, [])
            tail = self._tails.get(stream_id)
            if tail is not None and tail.start is not None and tail.end == offset:
                tail.failure = error
                del self._tails[stream_id]  # readers that attach later start afresh
                wake.extend(tail.waiters.items())
                tail.waiters.clear()
        for future in futures:
            _resolve(future, error)
        _wake(wake)

    async def _confirm_on_primary(
        self, conns: _FetchConnections, keys: list[tuple[uuid.UUID, int]], pages: dict[tuple[uuid.UUID, int], Page]
    ) -> bool:
        """With READ_DATABASE, ask the primary for the state of the streams that readers start on
        (and of streams the standby does not show): a standby may not have replayed their last
        chunks, or the stream itself, and no notification would announce those again. Pages of
        streams the standby does not have yet are held back. Return whether any was."""
        with self._lock:
            ask = {stream_id for stream_id, offset in keys if (stream_id, offset) in self._requests}
        ask.update(stream_id for (stream_id, _), page in pages.items() if not page.exists)
        if not ask:
            return False
        primary = await conns.primary()
        async with db.deadline(primary, "asking the primary"):
            cursor = await primary.execute(PRIMARY_STATE_SQL, (list(ask),), prepare=False)
            marks = [notify.Mark(*row) for row in await cursor.fetchall()]
        self.announce(marks)
        on_primary = {mark.stream_id for mark in marks}
        held = [key for key, page in pages.items() if not page.exists and key[0] in on_primary]
        for key in held:
            del pages[key]  # the reader's request stays open and is fetched again
        return bool(held)

    def _fetch_behind(self) -> None:
        """Fetch again the tails that are announced further than the read database showed."""
        self._behind_pending = False
        with self._lock:
            for tail in self._tails.values():
                if tail.waiters and tail.wants_fetch() and tail.start is not None:
                    tail.dirty = True
            self._work.set()

    def _collect(self, limit: int) -> tuple[list[tuple[uuid.UUID, int]], set[uuid.UUID]]:
        """The (stream, offset) pages to fetch now, at most ``limit``: readers' requests first,
        then dirty tails. What does not fit stays pending, for a round that follows at once."""
        with self._lock:
            self._kicked = False
            keys = dict.fromkeys(itertools.islice(self._requests, limit))
            more = len(self._requests) > len(keys)
            polled = set()
            for tail in self._tails.values():
                if tail.dirty and tail.start is not None:
                    key = (tail.stream_id, tail.end)
                    if key not in keys and len(keys) >= limit:
                        more = True
                        continue  # still dirty: fetched in the next round
                    keys[key] = None
                    if tail.polled:
                        polled.add(tail.stream_id)
                tail.dirty = tail.polled = False
            if more:
                self._work.set()
            return list(keys), polled

    def _deliver(self, pages: dict[tuple[uuid.UUID, int], Page], polled: set[uuid.UUID]) -> bool:
        """Answer readers' requests, fold pages into tails and wake the readers of tails that
        moved. Return whether a tail with waiting readers is announced further than its page
        showed (only a read database lagging behind the primary does that)."""
        behind = False
        wake: list[tuple[asyncio.AbstractEventLoop | None, Waiter]] = []
        answered: list[tuple[list[concurrent.futures.Future[Page]], Page]] = []
        with self._lock:
            for key, page in pages.items():
                stream_id, from_offset = key
                self.stats.chunks_fetched += len(page.chunks)
                futures = self._requests.pop(key, None)
                if futures:
                    answered.append((futures, page))
                tail = self._tails.get(stream_id)
                if tail is None:
                    continue
                if not page.exists:
                    tail.gone = True
                    moved = True
                else:
                    announced = tail.hint
                    moved = tail.merge(from_offset, page)
                    if stream_id in polled and page.next_offset > announced:
                        self.stats.poll_found += 1
                if tail.waiters and tail.wants_fetch() and tail.start is not None:
                    # Keep fetching forward only for readers that wait at the window's end; a
                    # reader still taking chunks asks again when it gets there (step()).
                    if page.next_offset > tail.end:
                        tail.dirty = True  # the page was full: the next one is there now
                        self._work.set()
                    elif not tail.dirty:  # (dirty: announced since this fetch began; fetched next)
                        behind = True  # a standby that has not replayed what was announced
                if moved:
                    wake.extend(tail.waiters.items())
                    tail.waiters.clear()
        for futures, page in answered:
            for future in futures:
                _resolve(future, page)
        _wake(wake)
        return behind

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and close its connections; waiting readers get a StreamError."""
        if self._thread.is_alive():
            try:
                self._loop.call_soon_threadsafe(self._stopping.set)
            except RuntimeError:
                pass
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("pgstreams: listener thread did not stop within %.1f s", timeout)
        self._shut()

    def _shut(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            requests, self._requests = self._requests, {}
            wake = [item for tail in self._tails.values() for item in tail.waiters.items()]
        for futures in requests.values():
            for future in futures:
                _resolve(future, StreamError("the pgstreams listener of this process was stopped"))
        _wake(wake)

    @property
    def stopped(self) -> bool:
        return self._stopped


Connect = Callable[[str, str], Awaitable[psycopg.AsyncConnection[Any]]]
Disconnect = Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]


class _FetchConnections:
    """The fetcher's connections: to READ_DATABASE (or DATABASE), and, when readers read from
    another database than the primary, one to the primary, opened on first use."""

    def __init__(self, connect: Connect, disconnect: Disconnect) -> None:
        self.standby = conf.read_database() != conf.database()
        self._connect = connect
        self._disconnect = disconnect
        self._read: psycopg.AsyncConnection[Any] | None = None
        self._primary: psycopg.AsyncConnection[Any] | None = None

    async def read(self) -> psycopg.AsyncConnection[Any]:
        if self._read is None or self._read.closed:
            self._read = await self._connect(conf.read_database(), "fetcher")
        return self._read

    async def primary(self) -> psycopg.AsyncConnection[Any]:
        if self._primary is None or self._primary.closed:
            self._primary = await self._connect(conf.database(), "checker")
        return self._primary

    async def close(self) -> None:
        for conn in (self._read, self._primary):
            if conn is not None:
                await self._disconnect(conn)
        self._read = self._primary = None


async def _fetch(
    conn: psycopg.AsyncConnection[Any], keys: list[tuple[uuid.UUID, int]]
) -> dict[tuple[uuid.UUID, int], Page]:
    # Not prepared: planned with the table's current size each time. A generic plan cached while
    # the chunk table was small can scan all of it once it has grown.
    params = ([k[0] for k in keys], [k[1] for k in keys], PAGE_SIZE)
    async with db.deadline(conn, "fetching chunks"):
        cursor = await conn.execute(FETCH_SQL, params, prepare=False)
        rows = await cursor.fetchall()
    pages: dict[tuple[uuid.UUID, int], Page] = {}
    for i, next_offset, closed, offset, data, created_at in rows:
        key = keys[i - 1]
        page = pages.get(key)
        if page is None:
            page = pages[key] = Page(exists=next_offset is not None, next_offset=next_offset or 0, closed=bool(closed))
        if offset is None or page.pruned_to is not None:
            continue
        if offset == key[1] + len(page.chunks):
            page.chunks.append(StreamChunk(key[0], offset, data, created_at))
        elif not page.chunks:
            page.pruned_to = offset  # offsets are the truth: never hand a chunk out under another
    for (_, from_offset), page in pages.items():
        if page.exists and not page.chunks and page.pruned_to is None and from_offset < page.next_offset:
            page.pruned_to = page.next_offset
    return pages


def _refused(exc: psycopg.DatabaseError, conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether the database refused the query itself, on a connection that still works (not a
    lost connection, nor a query cut off by its deadline)."""
    return not isinstance(exc, psycopg.OperationalError) and not conn.broken


def _resolve(future: concurrent.futures.Future[Page], outcome: Page | BaseException) -> None:
    """Settle a reader's request; a reader that gave up has cancelled it, and that is fine."""
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except concurrent.futures.InvalidStateError:
        pass


def _wake(waiters: list[tuple[asyncio.AbstractEventLoop | None, Waiter]]) -> None:
    """Set the waiters' events: sync ones here, async ones with one call into each event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Waiter]] = {}
    for loop, waiter in waiters:
        if loop is None:
            waiter.set()
        else:
            by_loop.setdefault(loop, []).append(waiter)
    for loop, events in by_loop.items():
        try:
            loop.call_soon_threadsafe(_set_all, events)
        except RuntimeError:  # that reader's loop is closed
            pass


def _set_all(events: list[Waiter]) -> None:
    for event in events:
        event.set()


async def _close_quietly(conn: psycopg.AsyncConnection[Any]) -> None:
    try:
        await conn.close()
    except Exception:
        pass


_listener: Listener | None = None
_listener_lock = threading.Lock()


def get_listener() -> Listener:
    """This process's listener, started on first use (and anew in a forked child)."""
    global _listener
    current = _listener
    if current is None or current.stopped:
        with _listener_lock:
            if _listener is None or _listener.stopped:
                _listener = Listener()
            current = _listener
    return current


def current_listener() -> Listener | None:
    """This process's listener if it runs, without starting one."""
    return _listener


def announce_local(mark: notify.Mark) -> None:
    """Wake this process's readers of a stream that a commit here just advanced."""
    current = _listener
    if current is not None:
        current.announce([mark])


def stop_listener() -> None:
    """Stop this process's listener, if it runs; the next reader starts a new one."""
    global _listener
    with _listener_lock:
        current, _listener = _listener, None
    if current is not None:
        current.stop()


def _after_fork_in_child() -> None:
    global _listener, _listener_lock
    _listener = None
    _listener_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(stop_listener)
