"""What the endpoints send of a stream's chunks, made once per process: the subscribers of one
stream in one process that are at the same place (a live stream's followers all are) get the
same encoded bytes, made by the first of them to ask and kept for the others; and the delivery
metrics are counted by that first one, not once per subscriber. ``ending_on_error`` is how a
response's body ends when its reading fails after the response began.

A subscriber at its stream's tail can also be followed for by the stream's fan in its event
loop (``follow``): one per stream and loop, called back by the listener, that steps through each
round once and hands the chunks to every follower at them, in one pass, each sending without
waiting (``start``). A follower whose window is full, or that falls behind, is handed back and
reads by itself until it catches up again; every follower is handed back when the stream ends
or its reading fails.

An encoding is keyed by its kind (a WebSocket frame's items, an SSE event run, a Durable Streams
body), the stream and the batch's first and last offsets: a chunk never changes once committed,
so an entry is right for as long as it is kept. At most ``ENTRIES`` are kept, of at most
``ENTRIES_BYTES`` of chunk data in all (an encoding is a small multiple of that: base64 is 4/3,
JSON escapes more), the oldest go first: sharing is between subscribers at the same place at
about the same time, so a little is enough, and a reader far behind the others costs them no
memory. What is per subscriber stays with each endpoint: its window and flow control, frame ids
and acks, its position. No SQL and no thread: the fans run in their subscribers' loops.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, Final, Protocol, TypeVar

from django.db import DatabaseError

from . import metrics
from .exceptions import StreamError
from .reader import Progress, Reading
from .reader import afollow as read_by_itself
from .types import StreamChunk
from .waits import ForPage

T = TypeVar("T")
logger = logging.getLogger("pgstreams.delivery")

# Encodings kept: a few rounds' worth for every stream a process follows, and of at most this
# much chunk data in all.
ENTRIES: Final = 8192
ENTRIES_BYTES: Final = 8 << 20
# What a fan leaves for a reader that takes its batches itself, at most (beyond one batch).
INBOX_CHUNKS: Final = 1024
INBOX_BYTES: Final = 1 << 20

# (kind, the stream's id as an int, first offset, last offset). Keys and entries hold only
# immutable values, which the garbage collector stops tracking at its first pass: kept for a few
# rounds, they would otherwise reach its old generation by the thousand.
Key = tuple[str, int, int, int]


class Encodings:
    """The process's shared encodings (see the module docstring)."""

    def __init__(self) -> None:
        self._entries: OrderedDict[Key, tuple[Any, int]] = OrderedDict()  # an encoding, its chunks' data size
        self._lock = threading.Lock()
        self._bytes = 0  # the kept entries' chunk data
        self.made = 0  # encodings made, and
        self.shared = 0  # encodings served to a second subscriber or more

    def get(self, kind: str, chunks: Sequence[StreamChunk], make: Callable[[Sequence[StreamChunk]], T]) -> T:
        """``make(chunks)``, made once for every subscriber that sends the same batch as ``kind``;
        the one that made it counts its delivery (``metrics.observe_delivery``)."""
        key = (kind, chunks[0].stream_id.int, chunks[0].offset, chunks[-1].offset)
        entry = self._entries.get(key)
        if entry is not None:
            self.shared += 1
            return entry[0]
        entry = (make(chunks), sum(len(chunk.data) for chunk in chunks))
        self.made += 1
        with self._lock:
            kept = self._entries.setdefault(key, entry)
            if kept is entry:
                self._bytes += entry[1]
                while len(self._entries) > ENTRIES or self._bytes > ENTRIES_BYTES:
                    self._bytes -= self._entries.popitem(last=False)[1][1]
        if kept is entry:  # not made by another thread at the same time
            metrics.observe_delivery(chunks)
        return kept[0]


encodings = Encodings()
shared = encodings.get


# -- live followers ------------------------------------------------------------------------------


class Follower(Protocol):
    """A subscriber that the fan of its stream delivers to while it is at the stream's tail."""

    position: int

    def take(self, progress: Progress) -> bool:
        """Send ``progress.chunks`` (they start at ``position``) without waiting; False if it
        cannot take them all now (its window is full: it may have taken the first ones, its
        position says): the fan hands it back."""
        ...


class _End:
    """The stream is closed, and the follower has every chunk of it."""


END: Final = _End()
# Why a fan hands a follower back: None (on its own again, from its position), END, or the error.
Handback = _End | BaseException | None


class _Fan:
    """One stream's followers in one event loop, and the one reader of the stream's tail for them
    all: a round's chunks are stepped through once and handed to each follower at them, in one
    pass. It steps when the listener calls it back (``Listener.push_step``), in its loop, and
    holds no task, coroutine or future between rounds: a thousand streams' waits, made anew each
    round, lived long enough to churn the collector's oldest generation. A page it must wait for
    (it starts behind the window, or the window moved past it) is awaited in a task."""

    def __init__(self, stream_id: uuid.UUID, first: Follower, fans: dict[uuid.UUID, _Fan]) -> None:
        self.stream_id, self._fans = stream_id, fans
        self.loop = asyncio.get_running_loop()
        self.followers: dict[Follower, asyncio.Future[Handback]] = {}
        self.first = self.add(first)
        self.reading = Reading(stream_id, first.position, None, self.loop)
        self.paging: asyncio.Task[None] | None = None  # awaiting a page
        self.done = False
        self.loop.call_soon(self.set)  # its first step: after its first follower is done joining

    @property
    def position(self) -> int:
        return self.reading.pos

    def add(self, follower: Follower) -> asyncio.Future[Handback]:
        future = self.followers[follower] = self.loop.create_future()
        return future

    def set(self) -> None:
        """Step from the fan's position and hand out what the tail holds, until it has to wait:
        first, and whenever the listener calls it back."""
        try:
            while not self.done and self.paging is None:
                step = self.reading.push_next(self)
                if step is None:
                    return  # called back once the tail moves
                if isinstance(step, ForPage):
                    self.paging = self.loop.create_task(self._page(step), name=f"pgstreams-fan-{self.stream_id}")
                    return
                chunks = self.reading.took(step.take(self.reading.left))
                if chunks is None:
                    return self.end(END)
                self.hand_out(chunks)
        except Exception as exc:  # the stream deleted or pruned, the listener stopped
            self.end(exc)

    async def _page(self, step: ForPage) -> None:
        try:
            chunks = self.reading.took(await step.take_async(self.reading.left))
        except Exception as exc:
            self.paging = None
            return self.end(exc)
        self.paging = None
        if chunks:
            self.hand_out(chunks)
        self.set()

    def hand_out(self, chunks: list[StreamChunk]) -> None:
        progress = self.reading.progress(chunks)
        for follower in list(self.followers):
            try:
                took = follower.position == chunks[0].offset and follower.take(progress)
            except Exception as exc:  # that follower's failure, not its stream's
                self.hand_back(follower, exc)
                continue
            except BaseException as exc:  # its send cancelled: every follower reads by itself again
                # Not raised on into the listener's callback, which steps other streams' fans after this one.
                self.end(None)
                if isinstance(exc, KeyboardInterrupt | SystemExit):
                    raise
                return
            if not took:
                self.hand_back(follower, None)

    def end(self, outcome: Handback) -> None:
        """Stop reading the stream and hand every follower back, with ``outcome`` (once): END,
        the error that ended its reading, or None when no follower is left."""
        if self.done:
            return
        self.done = True
        self.reading.close(self)
        if self.paging is not None:
            self.paging.cancel()
        if self._fans.get(self.stream_id) is self:
            del self._fans[self.stream_id]
        if not self._fans:
            _fans.pop(self.loop, None)
        for follower in list(self.followers):
            self.hand_back(follower, outcome)

    def hand_back(self, follower: Follower, why: Handback) -> None:
        future = self.followers.pop(follower, None)
        if future is not None and not future.done():
            future.set_result(why)
        if not self.followers:
            self.end(None)


_fans: dict[asyncio.AbstractEventLoop, dict[uuid.UUID, _Fan]] = {}  # each loop's, while it has any


def join(stream_id: uuid.UUID, follower: Follower) -> asyncio.Future[Handback] | None:
    """Have ``stream_id``'s fan in this event loop deliver to ``follower`` from
    ``follower.position`` (where it caught up with the tail); the future says when and why the
    fan hands it back: None (it is to go on by itself: its window is full, or it fell behind),
    END, or the error that ended the stream's reading. None at once if the fan is elsewhere in
    the stream. ``leave()`` when done with it."""
    fans = _fans.setdefault(asyncio.get_running_loop(), {})
    fan = fans.get(stream_id)
    if fan is None or fan.done:
        fan = fans[stream_id] = _Fan(stream_id, follower, fans)
        return fan.first
    if fan.position != follower.position:
        return None  # not where this fan is: the follower reads by itself
    return fan.add(follower)


def leave(stream_id: uuid.UUID, follower: Follower) -> None:
    fan = _fans.get(asyncio.get_running_loop(), {}).get(stream_id)
    if fan is not None:
        fan.hand_back(follower, None)


async def follow(stream_id: uuid.UUID, follower: Follower) -> Handback:
    """``join()``, then wait to be handed back (None at once if the fan is elsewhere)."""
    future = join(stream_id, follower)
    if future is None:
        return None
    try:
        return await future
    finally:
        leave(stream_id, follower)


class _Inbox:
    """A follower for a reader that takes its batches itself (a streaming response's body):
    the fan leaves them here, and wakes it; at most INBOX_CHUNKS chunks and INBOX_BYTES of their
    data wait, beyond one batch (a reader that does not come for them is handed back, and reads
    by itself). Waking costs a future per wait, and silence one timer per ``idle`` seconds, not
    one per batch: a reader is owed a keepalive once a whole interval passed with no batch, so
    after between one and two intervals of silence."""

    def __init__(self, position: int, idle: float | None) -> None:
        self.position = position
        self.batches: collections.deque[Progress] = collections.deque()
        self.chunks = self.bytes = 0  # waiting
        self.waiter: asyncio.Future[None] | None = None  # the reader's, while it waits
        self.heard = False  # a batch came in the current interval
        self.owed = False  # a keepalive: an interval passed with no batch
        self.ticking = None if idle is None else asyncio.get_running_loop().call_later(idle, self.tick, idle)

    def take(self, progress: Progress) -> bool:
        size = progress.size
        if self.batches and (self.chunks + len(progress.chunks) > INBOX_CHUNKS or self.bytes + size > INBOX_BYTES):
            return False
        self.chunks += len(progress.chunks)
        self.bytes += size
        self.batches.append(progress)
        self.position = progress.chunks[-1].offset + 1
        self.heard = True
        self.wake()
        return True

    def next(self) -> Progress:
        progress = self.batches.popleft()
        self.chunks -= len(progress.chunks)
        self.bytes -= progress.size
        return progress

    def wake(self, *_: object) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def tick(self, idle: float) -> None:
        if not self.heard:
            self.owed = True
            self.wake()
        self.heard = False
        self.ticking = asyncio.get_running_loop().call_later(idle, self.tick, idle)

    async def wait(self) -> None:
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    def close(self) -> None:
        if self.ticking is not None:
            self.ticking.cancel()


async def afollow(stream_id: uuid.UUID, *, from_offset: int = 0, idle: float | None = None) -> AsyncIterator[Progress]:
    """``reader.afollow()`` (with ``idle``) for a response's body: it reads by itself until it is
    at the stream's tail, then takes what the stream's fan hands out there, with every other
    subscriber at the tail in this event loop; back by itself when the fan hands it back."""
    position = from_offset
    while True:
        async with contextlib.aclosing(read_by_itself(stream_id, from_offset=position, idle=idle)) as batches:
            async for progress in batches:
                yield progress
                if progress.chunks:
                    position = progress.chunks[-1].offset + 1
                if progress.closed:
                    return
                if progress.chunks and progress.caught_up:
                    break
            else:
                return
        inbox = _Inbox(position, idle)
        handback = join(stream_id, inbox)
        if handback is None:
            inbox.close()
            continue
        handback.add_done_callback(inbox.wake)
        try:
            while True:
                while inbox.batches:
                    progress = inbox.next()
                    yield progress
                    if progress.closed:
                        return
                if handback.done():
                    break
                if inbox.owed:
                    inbox.owed = False
                    yield Progress([], caught_up=True, closed=False, size=0)  # idle: a keepalive
                    continue
                await inbox.wait()
        finally:
            inbox.close()
            leave(stream_id, inbox)
        why = handback.result()
        if isinstance(why, BaseException):
            raise reraised(why)
        if why is END:
            return
        position = inbox.position


async def ending_on_error(
    body: AsyncIterator[bytes], what: str, last: Callable[[Exception], bytes] | None = None
) -> AsyncIterator[bytes]:
    """``body``, a streaming response's, ended instead of raised out of when it fails (the
    database lost mid-answer, a StreamError), after ``last(error)`` if given: the error is logged
    (``what`` names the response) and the client, which sees the response end, resumes from what
    it read. Raised out of after the response began, an exception has no answer left to make,
    and daphne's handling of it (a second response start, refused with ValueError) stops the
    check that closes every later failed connection of the process: they stayed open, silent."""
    async with contextlib.aclosing(body):
        try:
            async for part in body:
                yield part
        except Exception as exc:
            if (task := asyncio.current_task()) is not None and task.cancelling():
                raise  # raised by the body's cleanup as it was cancelled: the cancel goes on
            if isinstance(exc, DatabaseError | StreamError):
                logger.warning("pgstreams: ending %s: %s", what, exc)
            else:
                logger.exception("pgstreams: ending %s after an error", what)
            error = exc
        else:
            return
    if last is not None:
        yield last(error)


def reraised(error: BaseException) -> BaseException:
    """``error``, which a fan hands to each of its followers, to be raised afresh by each: without
    the tracebacks of those that raised it before (each raise would add its own to them)."""
    return error.with_traceback(None)


def start(send: Awaitable[Any]) -> asyncio.Task[None] | None:
    """Run ``send`` now, until it first waits: None if it finished (a server's send mostly does:
    daphne's always, uvicorn's and granian's unless their client is slow), else the task that
    finishes it, so that a fan never waits for one follower's socket. An exception it raises at
    once propagates; one it raises later is the task's. It is stepped as ``await`` steps it,
    with ``next()``: granian's sends are iterators that have no ``send()``."""
    steps = send.__await__()
    try:
        awaited = next(steps)
    except StopIteration:
        return None
    return asyncio.get_running_loop().create_task(_finish(steps, awaited))


async def _finish(steps: Iterator[Any], awaited: Any) -> None:
    """Go on with an awaitable that ``start()`` ran until it waited on ``awaited`` (a future, or
    None for a bare yield). Each step resumes it as its event loop would: the future it waited
    on is done, and it takes the result or the exception from there; this task's cancellation
    cancels that future, so it reaches the awaitable the same way. A future is taken as a task
    takes one its coroutine yields (``_asyncio_future_blocking`` cleared): awaited again while
    still set, a future implemented in C raised "await wasn't used with future", and a send
    that had to wait (uvicorn's for a slow client) failed."""
    while True:
        if awaited is None:
            await asyncio.sleep(0)
        else:
            if getattr(awaited, "_asyncio_future_blocking", False):
                awaited._asyncio_future_blocking = False
            with contextlib.suppress(BaseException):  # the awaitable gets it from the future
                await awaited
        try:
            awaited = next(steps)
        except StopIteration:
            return
