"""The per-process listener: one LISTEN connection, one fetch connection and the fallback poll,
shared by every reader, sync or async, in the process. With READ_DATABASE the fetch connection
goes to a standby, and a third one asks the primary about streams readers start on.

It runs an asyncio loop in one named daemon thread. For each stream that readers here follow it
keeps a ``Tail`` (window.py). Notifications, commits in this process and the poll only mark
tails dirty; one query (fetch.py) then fetches the new chunks of every dirty tail together with
each stream's state, in one snapshot, and wakes the readers of the tails that moved (or calls
back delivery's fans, ``push_step``). Readers never query the database themselves: ``step()``
tells a reader what to do next (waits.py), and readers asking for the same page share one fetch
(for a tail made since that fetch began, the page is fetched again: it may predate a commit
announced to no one here).

The LISTEN connection listens to the notification channels (one per shard, NOTIFY_SHARDS) of
the streams followed here, and a stream is fetched only once its channel is listened to.

Readers wait for "the tail has passed my offset", never for a flag another reader could clear.
Every query has QUERY_TIMEOUT to be answered, and the LISTEN connection is checked with a query
every LISTEN_CHECK_INTERVAL (which also reads the notification queue's usage for guard.py), so
a connection whose peer vanished is replaced within seconds. This module does not write to the
database and does not know about the notification buffer.

About 680 lines, over the project's 350: what is left is one class whose parts (the readers'
side, the three loops, the channels listened to, delivery) all act on the same tails under one
lock; the window arithmetic is in window.py, the queries in fetch.py, the readers' steps in
waits.py, the stuck listeners in guard.py.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import random
import threading
import time
import uuid
from typing import Any

import psycopg
from psycopg import pq, sql

from . import conf, db, fetch, guard, notify
from .exceptions import StreamError, StreamNotFound
from .process import PerProcess
from .stats import ListenerStats
from .types import Mark
from .waits import END, ForPage, ForTail, Ready, Step, settle, wake
from .window import Page, Push, Tail, Waiter

_random = random.Random()  # its own: the global state a project may seed is left alone
logger = logging.getLogger("pgstreams.listener")


class Listener:
    """This process's listener; get it with ``get_listener()``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tails: dict[uuid.UUID, Tail] = {}
        self._dirty: dict[Tail, None] = {}  # the tails to fetch, marked so (``tail.dirty``), in the order marked
        self._followed: dict[str, Tail] = {}  # the same tails by their stream's hex id (notify.encode)
        self._requests: dict[fetch.Key, list[concurrent.futures.Future[Page]]] = {}
        self._kicked = False
        self._round = 0  # fetch rounds collected (_collect); one is fetched at a time
        self._behind_pending = False  # a _fetch_behind() is scheduled
        self._fetch_limit = fetch.FETCH_KEYS
        self._conns: set[psycopg.AsyncConnection[Any]] = set()  # open, severed at stop
        # Notification channels (one per shard, NOTIFY_SHARDS): followed tails per channel, and the
        # channels the LISTEN connection listens to (none while it is down). A tail whose channel is
        # not listened to yet is not fetched until it is (_collect), so no notification can fall between.
        self._channel_tails: collections.Counter[str] = collections.Counter()
        self._listened: set[str] = set()
        self._listen_kicked = False
        self._stopped = False
        self.stats = ListenerStats()
        self.listening = threading.Event()  # set while the LISTEN connection is up (see _listened)
        self._loop = asyncio.new_event_loop()
        self._work = asyncio.Event()
        self._to_listen = asyncio.Event()  # a followed channel is not listened to yet
        self._stopping = asyncio.Event()
        self._thread = threading.Thread(target=self._run, name="pgstreams-listener", daemon=True)
        self._thread.start()

    # -- the readers' side (any thread) --------------------------------------------------------

    def attach(self, stream_id: uuid.UUID) -> Tail:
        with self._lock:
            tail = self._tails.get(stream_id)
            if tail is None:
                tail = Tail(stream_id, notify.channel_for(stream_id), born=self._round)
                self._tails[stream_id] = self._followed[stream_id.hex] = tail
                self._channel_tails[tail.channel] += 1
                if tail.channel not in self._listened:
                    self._kick_listen()
            tail.readers += 1
            return tail

    def detach(self, tail: Tail, push: Push | None = None) -> None:
        """A reader of ``tail`` is gone (and ``push``, if it was one, is called back no more)."""
        with self._lock:
            if push is not None:
                tail.pushes.pop(push, None)
            tail.readers -= 1
            if tail.readers <= 0 and self._tails.get(tail.stream_id) is tail:
                self._forget(tail)

    def _forget(self, tail: Tail) -> None:
        # With the lock held. Its channel is unlistened at the next check if no tail is left on it.
        del self._tails[tail.stream_id]
        del self._followed[tail.stream_id.hex]
        self._dirty.pop(tail, None)
        self._channel_tails[tail.channel] -= 1
        if not self._channel_tails[tail.channel]:
            del self._channel_tails[tail.channel]

    def step(self, tail: Tail, pos: int, loop: asyncio.AbstractEventLoop | None) -> Step:
        """What a reader at ``pos`` does next (waits.py): take chunks, end, or wait for a page
        or for the tail, in ``loop`` (None: a thread).

        What a reader waits on is registered under the same lock that guards every change to
        the tail, so a change after this call always wakes it.
        """
        step = self._locked_step(tail, pos, loop, None)
        assert step is not None
        return step

    def push_step(self, tail: Tail, pos: int, push: Push) -> Step | None:
        """``step()`` for a reader called back rather than waiting for the tail: None where
        ``step()`` would wait for it, and then ``push.set()`` is called in ``push.loop`` once the
        tail moves (once: it steps again)."""
        return self._locked_step(tail, pos, push.loop, push)

    def _locked_step(
        self, tail: Tail, pos: int, loop: asyncio.AbstractEventLoop | None, push: Push | None
    ) -> Step | None:
        to_wake: list[tuple[asyncio.AbstractEventLoop | None, Waiter]] = []
        try:
            with self._lock:
                return self._step(tail, pos, loop, push, to_wake)
        finally:
            wake(to_wake)  # with the lock released

    def _step(
        self,
        tail: Tail,
        pos: int,
        loop: asyncio.AbstractEventLoop | None,
        push: Push | None,
        to_wake: list[tuple[asyncio.AbstractEventLoop | None, Waiter]],
    ) -> Step | None:
        # With the lock held; the waiters to wake go to ``to_wake``.
        if self._stopped:
            raise StreamError("the pgstreams listener of this process was stopped; read again")
        if tail.gone:
            raise StreamNotFound(f"stream {tail.stream_id} was deleted while being read")
        start = tail.start
        if start is not None and start <= pos < tail.end:
            i = pos - start
            return Ready(tail.batch(i, fetch.PAGE_BYTES))
        if tail.failure is not None:
            raise StreamError(str(tail.failure)) from tail.failure.__cause__
        if tail.final is not None and pos >= tail.final:
            return END
        if start is not None and pos > tail.end and tail.jump(pos):
            # Ahead of the window: it moves here. Readers waiting at its old end may be behind it
            # now: they step again, and fetch their own pages.
            start = tail.start
            to_wake.extend(tail.woken())
        if start is None or pos < start:
            future: concurrent.futures.Future[Page] = concurrent.futures.Future()
            self._requests.setdefault((tail.stream_id, pos), []).append(future)
            self._kick()
            return ForPage(future, tail.stream_id, pos)
        if tail.wants_fetch() and not tail.dirty:
            # More was announced than the window holds: fetch it now that a reader waits.
            self._mark(tail)
            self._kick()
        if push is not None:
            tail.pushes[push] = None
            return None
        waiter = tail.waiters.get(loop)
        if waiter is None:
            waiter = tail.waiters[loop] = threading.Event() if loop is None else asyncio.Event()
        return ForTail(waiter)

    # -- announcements (any thread) ------------------------------------------------------------

    def announce(self, marks: list[Mark]) -> None:
        """Note that streams reached these offsets; tails that fall behind are fetched."""
        with self._lock:
            for mark in marks:
                tail = self._tails.get(mark.stream_id)
                if tail is not None:
                    self._advance(tail, mark.next_offset, mark.closed)

    def _advance(self, tail: Tail, next_offset: int, closed: bool) -> None:
        # With the lock held.
        tail.heard += 1
        if next_offset > tail.hint:
            tail.hint = next_offset
        tail.close_hinted |= closed
        if tail.wants_fetch() and tail.start is not None:
            if not tail.dirty:  # _mark() inline (the tail is its stream's): runs for every entry heard
                tail.dirty = True
                self._dirty[tail] = None
            self._kick()

    def _mark(self, tail: Tail) -> None:
        # With the lock held: fetch the tail in the next round (``_collect`` looks at these only),
        # if it is still the stream's (a reader may step on one forgotten since, which is not fetched).
        if not tail.dirty and self._tails.get(tail.stream_id) is tail:
            tail.dirty = True
            self._dirty[tail] = None

    def hear(self, payload: str) -> None:
        """Announce what a notification says of the streams followed here. An entry for any
        other stream costs a slice and a dictionary lookup: it is never parsed (and for one of
        these, its id is not parsed: the tail has it)."""
        began = time.thread_time()  # CPU time: not the waits for the GIL
        entries = payload.split(",")
        with self._lock:
            for entry in entries:
                tail = self._followed.get(entry[:32])
                if tail is not None and entry[32:33] == ":":
                    try:
                        next_offset, closed = notify.decode_state(entry[33:])
                    except ValueError:
                        logger.debug("ignoring notification entry %r", entry)
                        continue
                    self._advance(tail, next_offset, closed)
        self.stats.notifications += 1
        self.stats.entries += len(entries)
        self.stats.hear_seconds += time.thread_time() - began

    def _kick_listen(self) -> None:
        # Called with the lock held; coalesces wake-ups of the LISTEN loop.
        if not self._listen_kicked:
            self._listen_kicked = True
            self._set_in_loop(self._to_listen)

    def _kick(self) -> None:
        # Called with the lock held; coalesces wake-ups of the fetch loop.
        if not self._kicked:
            self._kicked = True
            self._set_in_loop(self._work)

    def _set_in_loop(self, event: asyncio.Event) -> None:
        try:
            self._loop.call_soon_threadsafe(event.set)
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
                error = None if task.cancelled() else task.exception()  # retrieved, logged or not
                if self._stopping.is_set():
                    continue  # it ended at the stop, which is being handled
                if not task.cancelled():
                    logger.error("pgstreams: %s failed, restarting it", name, exc_info=error)
                self.stats.restarts += 1
                self._work.set()  # whatever the failed loop was doing is done again
                tasks[asyncio.create_task(loops[name](), name=name)] = name
        for conn in self._conns:
            db.sever(conn)  # a query in flight fails now instead of waiting for a cancel to be answered
        # Let those queries fail before the loops are cancelled: a loop cancelled in the middle of
        # a query has psycopg cancel it on the server, which at interpreter exit fails and says so.
        for _ in range(100):
            if not any(conn.pgconn.transaction_status == pq.TransactionStatus.ACTIVE for conn in self._conns):
                break
            await asyncio.sleep(0.005)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _connect(self, alias: str, role: str) -> psycopg.AsyncConnection[Any]:
        conn = await db.aconnect(alias, role)
        self._conns.add(conn)
        if self._stopping.is_set():
            db.sever(conn)  # connected after stop() severed the others: its first query fails too
        return conn

    async def _disconnect(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conns.discard(conn)
        await db.close_quietly(conn)

    async def _listen_forever(self) -> None:
        backoff = db.Backoff()
        connected_before = False
        while True:
            conn = None
            try:
                conn = await self._connect(conf.listen_database(), "listener")
                await _limit_unacknowledged(conn)
                if connected_before:
                    self.stats.reconnects += 1
                connected_before = True
                backoff.reset()
                self.listening.set()
                await self._hear(conn)  # LISTENs first, then fetches what was announced meanwhile
            except Exception as exc:  # a database blip must not end the loop
                if self._stopping.is_set():
                    return  # severed by stop()
                self.stats.listen_errors += 1
                logger.warning("pgstreams: listener connection lost, reconnecting: %s", exc)
            finally:
                self.listening.clear()
                with self._lock:
                    self._listened = set()  # tails are fetched without waiting for a LISTEN
                if conn is not None:
                    await self._disconnect(conn)
            # Notifications may have been missed: every followed stream is read again at once.
            self._refetch_all()
            await asyncio.sleep(backoff.next())

    async def _hear(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Announce what notifications say, until the connection fails. Every
        LISTEN_CHECK_INTERVAL a query proves the connection alive (or, unanswered within
        QUERY_TIMEOUT, fails it: a peer that vanished sends no error, only silence), shows
        Postgres that this listener runs (guard.py) and reads the notification queue's usage."""
        while True:
            check_at = time.monotonic() + conf.listen_check_interval()
            while (left := check_at - time.monotonic()) > 0:
                await self._listen(conn)
                await self._hear_until(conn, left)
            async with db.deadline(conn, "checking the LISTEN connection"):
                usage = (await (await conn.execute(guard.signed(guard.USAGE_SQL))).fetchone())[0]
                if guard.due(usage):
                    await guard.alook(conn, usage)
                await self._unlisten(conn)
            self.stats.listen_checks += 1

    async def _hear_until(self, conn: psycopg.AsyncConnection[Any], timeout: float) -> None:
        """Hear notifications for ``timeout`` seconds, or until a channel is to be listened to."""
        if self._to_listen.is_set():
            return
        hearing = asyncio.ensure_future(self._notes(conn, timeout))
        asked = asyncio.ensure_future(self._to_listen.wait())
        try:
            await asyncio.wait((hearing, asked), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (hearing, asked):
                task.cancel()  # between reads: psycopg has consumed nothing it has not yielded
            await asyncio.gather(hearing, asked, return_exceptions=True)
        if not hearing.cancelled() and hearing.exception() is not None:
            raise hearing.exception()  # type: ignore[misc]

    async def _notes(self, conn: psycopg.AsyncConnection[Any], timeout: float) -> None:
        async for note in conn.notifies(timeout=timeout):
            self.hear(note.payload)

    async def _listen(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """LISTEN to the followed streams' channels not listened to yet, then fetch their tails:
        what was announced before the LISTEN took effect is read, what comes after is heard."""
        with self._lock:
            self._to_listen.clear()
            self._listen_kicked = False
            channels = set(self._channel_tails) - self._listened
        if not channels:
            return
        async with db.deadline(conn, "LISTEN"):
            await conn.execute(_channels_statement("LISTEN", channels))
        with self._lock:
            self._listened |= channels
            for tail in self._tails.values():
                if tail.channel in channels:
                    self._mark(tail)
            self._work.set()

    async def _unlisten(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """UNLISTEN the channels no followed stream is on (a tail attached meanwhile listens again)."""
        with self._lock:
            channels = self._listened - set(self._channel_tails)
            self._listened -= channels
        if channels:
            await conn.execute(_channels_statement("UNLISTEN", channels))

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(conf.poll_interval() * _random.uniform(0.8, 1.2))
            with self._lock:
                for tail in self._tails.values():
                    self._mark(tail)
                    tail.polled = True
                followed = bool(self._tails)
            if followed:
                self.stats.polls += 1
                self._work.set()

    def _refetch_all(self) -> None:
        with self._lock:
            for tail in self._tails.values():
                self._mark(tail)
            self._work.set()

    async def _fetch_forever(self) -> None:
        backoff = db.Backoff()
        # While the read database is behind what was announced, ask it again at growing intervals.
        behind = db.Backoff(first=0.002, cap=0.1)
        conns = fetch.Connections(self._connect, self._disconnect)
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
                    if self._stopping.is_set():
                        return  # severed by stop()
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
                                self._mark(self._tails[stream_id])
                    await asyncio.sleep(backoff.next())
                    self._work.set()
                    continue
                backoff.reset()
                self._fetch_limit = min(fetch.FETCH_KEYS, 2 * self._fetch_limit)
                if waiting:
                    self.stats.read_behind += 1
                    if not self._behind_pending:  # one retry pending at a time
                        self._behind_pending = True
                        self._loop.call_later(behind.next(), self._fetch_behind)
                else:
                    behind.reset()
        finally:
            await conns.close()

    async def _fetch_round(self, conns: fetch.Connections, keys: list[fetch.Key], polled: set[uuid.UUID]) -> bool:
        """Fetch the pages of ``keys`` and deliver them (nothing here outlives the round);
        return whether a reader waits for chunks the read database does not show yet."""
        began = time.monotonic()
        pages = await fetch.fetch_pages(await conns.read(), keys, self._refuse)
        waiting = False
        if conns.standby:
            with self._lock:
                starting = {stream_id for stream_id, offset in keys if (stream_id, offset) in self._requests}
                # Announced further than the standby shows: lagging, or announced falsely.
                ahead = {
                    stream_id
                    for (stream_id, _), page in pages.items()
                    if (tail := self._tails.get(stream_id)) is not None
                    and (tail.hint > page.next_offset or (tail.close_hinted and not page.closed))
                }
            marks, waiting = await fetch.confirm_on_primary(conns, starting | ahead, pages)
            self._settle(marks)
        self.stats.fetch_seconds += time.monotonic() - began
        self.stats.fetches += 1
        return self._deliver(pages, polled, primary=not conns.standby) or waiting

    def _settle(self, marks: list[Mark]) -> None:
        """Take what the primary says of streams as their state, unless an announcement came since
        it was asked (that one is fetched next)."""
        with self._lock:
            for mark in marks:
                tail = self._tails.get(mark.stream_id)
                if tail is None:
                    continue
                if tail.heard == tail.asked:
                    tail.settle(mark.next_offset, mark.closed)
                else:
                    self._advance(tail, mark.next_offset, mark.closed)

    def _refuse(self, key: fetch.Key, exc: Exception) -> None:
        """Fail the readers waiting for a page the database refuses to give; no one else."""
        stream_id, offset = key
        logger.warning("pgstreams: cannot read stream %s from offset %d: %s", stream_id, offset, exc)
        self.stats.fetch_errors += 1
        error = StreamError(f"reading stream {stream_id} from offset {offset} failed: {exc}")
        error.__cause__ = exc
        to_wake: list[tuple[asyncio.AbstractEventLoop | None, Waiter]] = []
        with self._lock:
            futures = self._requests.pop(key, [])
            tail = self._tails.get(stream_id)
            if tail is not None and tail.start is not None and tail.end == offset:
                tail.failure = error
                self._forget(tail)  # readers that attach later start afresh
                to_wake.extend(tail.woken())
        for future in futures:
            settle(future, error)
        wake(to_wake)

    def _fetch_behind(self) -> None:
        """Fetch again the tails that are announced further than the read database showed."""
        self._behind_pending = False
        with self._lock:
            for tail in self._tails.values():
                if tail.waiting() and tail.wants_fetch() and tail.start is not None:
                    self._mark(tail)
            self._work.set()

    def _collect(self, limit: int) -> tuple[list[fetch.Key], set[uuid.UUID]]:
        """The (stream, offset) pages to fetch now, at most ``limit``: readers' requests first,
        then dirty tails. What does not fit stays pending, for a round that follows at once."""
        with self._lock:
            self._kicked = False
            self._round += 1
            # While LISTEN is up, a channel not listened to yet waits for its LISTEN (_listen).
            held = self._channel_tails.keys() - self._listened if self.listening.is_set() else set()
            ready = [key for key in self._requests if not held or self._channel_of(key[0]) not in held]
            keys = dict.fromkeys(ready[:limit])
            more = len(ready) > limit
            polled = set()
            marked, self._dirty = self._dirty, {}
            for tail in marked:  # the tails marked, not every one followed
                if held and tail.channel in held:
                    self._dirty[tail] = None  # still dirty: fetched once its channel is listened to
                    continue
                if tail.start is not None:
                    key = (tail.stream_id, tail.end)
                    if key not in keys and len(keys) >= limit:
                        more = True
                        self._dirty[tail] = None  # still dirty: fetched in the next round
                        continue
                    keys[key] = None
                    if tail.polled:
                        polled.add(tail.stream_id)
                tail.dirty = tail.polled = False
            for stream_id, _ in keys:
                if (tail := self._tails.get(stream_id)) is not None:
                    tail.asked = tail.heard
            if more:
                self._work.set()
            return list(keys), polled

    def _channel_of(self, stream_id: uuid.UUID) -> str | None:
        # With the lock held. None for a request whose tail was forgotten (_refuse): nothing to hold it for.
        tail = self._tails.get(stream_id)
        return tail.channel if tail is not None else None

    def _deliver(self, pages: dict[fetch.Key, Page], polled: set[uuid.UUID], *, primary: bool) -> bool:
        """Answer readers' requests, fold pages into tails and wake the readers of tails that
        moved. A page read on the primary is the stream's state (``Tail.settle``) unless an
        announcement came since it was asked. Return whether a tail with waiting readers is
        announced further than its page showed (only a read database lagging behind the primary
        does that)."""
        behind = False
        budget = conf.window_bytes()
        to_wake: list[tuple[asyncio.AbstractEventLoop | None, Waiter]] = []
        answered: list[tuple[list[concurrent.futures.Future[Page]], Page]] = []
        with self._lock:
            for key, page in pages.items():
                stream_id, from_offset = key
                self.stats.chunks_fetched += len(page.values)
                self.stats.data_fetched += page.data
                tail = self._tails.get(stream_id)
                if tail is not None and tail.born >= self._round:
                    # Asked for by readers that left before this tail was made: the page may
                    # predate a commit announced to no one here. Its readers' requests stay, and
                    # are fetched anew.
                    self._work.set()
                    continue
                futures = self._requests.pop(key, None)
                if futures:
                    answered.append((futures, page))
                if tail is None:
                    continue
                if not page.exists:
                    tail.gone = True
                    moved = True
                else:
                    announced = tail.hint
                    if primary and tail.heard == tail.asked:
                        tail.settle(page.next_offset, page.closed)
                    moved = tail.merge(from_offset, page, budget)
                    if stream_id in polled and page.next_offset > announced:
                        self.stats.poll_found += 1
                if tail.waiting() and tail.wants_fetch() and tail.start is not None:
                    # Keep fetching forward only for readers that wait at the window's end; a
                    # reader still taking chunks asks again when it gets there (step()).
                    if page.next_offset > tail.end:
                        self._mark(tail)  # the page was full: the next one is there now
                        self._work.set()
                    elif not tail.dirty:  # (dirty: announced since this fetch began; fetched next)
                        behind = True  # a standby that has not replayed what was announced
                if moved:
                    to_wake.extend(tail.woken())
        for futures, page in answered:
            for future in futures:
                settle(future, page)
        wake(to_wake)
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
            to_wake = [item for tail in self._tails.values() for item in tail.woken()]
        for futures in requests.values():
            for future in futures:
                settle(future, StreamError("the pgstreams listener of this process was stopped"))
        wake(to_wake)

    @property
    def stopped(self) -> bool:
        return self._stopped


async def _limit_unacknowledged(conn: psycopg.AsyncConnection[Any]) -> None:
    """Give the LISTEN session the server-side ``tcp_user_timeout`` of our own side: over TCP, a
    process that stops reading then has its session cut within that long of the server's first
    unacknowledged send, instead of holding the notification queue (a Unix socket ignores it;
    guard.py covers both). Not with NOTIFY_QUEUE_GUARD None, nor where the alias sets it to 0; if
    the server or a pooler refuses it, that is logged and the session goes on without it."""
    timeout = db.connect_kwargs(conf.listen_database(), "listener").get("tcp_user_timeout")
    if conf.notify_queue_guard() is None or not timeout:
        return
    statement = sql.SQL(guard.signed("SET tcp_user_timeout = {}")).format(sql.Literal(int(timeout)))
    try:
        async with db.deadline(conn, "setting the LISTEN session's tcp_user_timeout"):
            await conn.execute(statement)
    except psycopg.DatabaseError as exc:
        if conn.broken:
            raise
        logger.warning("pgstreams: the LISTEN session goes on without a server-side tcp_user_timeout: %s", exc)


def _channels_statement(command: str, channels: set[str]) -> sql.Composed:
    """``LISTEN`` or ``UNLISTEN`` of ``channels``, in one round trip."""
    statements = sql.SQL("; ").join(sql.SQL(command + " {}").format(sql.Identifier(c)) for c in sorted(channels))
    return sql.SQL(guard.signed("{}")).format(statements)


_listeners: PerProcess[Listener] = PerProcess(Listener, Listener.stop, alive=lambda listener: not listener.stopped)
get_listener = _listeners.get  # this process's listener, started on first use
current_listener = _listeners.current  # the listener if it runs, without starting one
stop_listener = _listeners.stop  # stop it; the next reader starts a new one


def announce_local(marks: list[Mark]) -> None:
    """Wake this process's readers of streams that a commit here just advanced."""
    current = current_listener()
    if current is not None:
        current.announce(marks)
