"""The append path's Python API: ``append``, ``aappend`` and ``stream_writer``. Each checks its
chunk and hands the process's appender (``appender``) an item, ``Append`` for a call and
``Sends`` for a stream writer's chunks, gathered while they wait, and a writer's close queued
behind its chunks (``_Close``); the appender commits them in batches and settles them. Here: how
a caller waits (a thread's future, an event loop's future, or a writer's count of chunks
settled, with at most WRITER_IN_FLIGHT in flight), what it raises, and what a writer whose task
is cancelled leaves (its chunks and its close commit all the same, the close never after a chunk
that failed; a failure is logged). No SQL and no thread of its own."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final

from . import conf, producers, writer
from .appender import Appender, appender
from .batch import Accepted, Append, Chain, Item, Row, Sends
from .exceptions import StreamClosed, StreamError, StreamNotFound
from .types import Producer, stream_uuid

# Chunks a stream writer may have sent and not yet seen committed before send() waits.
WRITER_IN_FLIGHT: Final = 1000

logger = logging.getLogger("pgstreams.appender")


def _prepare(stream_id: Any, data: str, producer: Producer | None, using: str | None) -> tuple[Any, ...]:
    sid = stream_uuid(stream_id)
    writer.check_chunk(data, conf.max_chunk_bytes())
    return sid, producers.checked(producer) if producer is not None else None, appender(using or conf.database())


def append(
    stream_id: Any, data: str, *, close: bool = False, producer: Producer | None = None, using: str | None = None
) -> int | None:
    """Append ``data`` to a stream and return its offset once it is committed.

    Not part of the caller's transaction: the chunk is committed (at ``SYNCHRONOUS_COMMIT``)
    together with the other appends of this process, whatever transaction the caller is in,
    and stays committed if that transaction rolls back. Use ``write()`` for a chunk that must
    commit or roll back with other changes.

    Args:
        close: close the stream with this chunk, in the same transaction: its last chunk, or
            ``StreamClosed`` and nothing written if it was closed already.
        producer: ``pgstreams.Producer(id, epoch, seq)``, as for ``write()``: an append retried
            with the same three returns None instead of storing the chunk twice.

    Raises:
        StreamNotFound (also for a stream deleted or past its expiry), StreamClosed, ChunkTooLarge,
        InvalidChunk (also for a chunk the stream's content type cannot hold, as for
        ``write()``), ProducerFenced, ProducerGap, each affecting only this call, never the
        other appends of its batch; StreamError if another
        transaction holds the stream's row for QUERY_TIMEOUT; TypeError for non-str data;
        OutcomeUnknown if the connection failed during the commit and the database could not be
        asked in time.
    """
    sid, checked, target = _prepare(stream_id, data, producer, using)
    future: concurrent.futures.Future[int | None] = concurrent.futures.Future()
    target.submit(Append(sid, future, producer=checked, data=data, closing=close))
    return future.result()


async def aappend(
    stream_id: Any, data: str, *, close: bool = False, producer: Producer | None = None, using: str | None = None
) -> int | None:
    """``append()`` for async code: waits for the commit without holding the event loop or a
    thread. A cancelled call may still be committed."""
    sid, checked, target = _prepare(stream_id, data, producer, using)
    loop = asyncio.get_running_loop()
    return await target.asubmit(Append(sid, loop.create_future(), loop, producer=checked, data=data, closing=close))


@dataclass(slots=True, eq=False)
class _Close(Item):
    """A stream writer's close (``close=True``), queued behind the chunks it sent, the last item
    of their chain: it commits in their batch or a later one, never ahead of them, and fails
    unsent once one of them failed (a stream closed without its tail would look whole). Its
    result: the stream's chunk count."""

    @property
    def size(self) -> int:
        return 0  # it writes no chunk

    def judge(self, row: Row | None, producer_state: tuple[int, int] | None) -> Accepted | BaseException:
        if row is None or row.gone:
            return StreamNotFound(f"no stream {self.stream_id}")
        if row.closed:
            return StreamClosed(f"stream {self.stream_id} is already closed")
        return Accepted([], closing=True)

    def result(self, row: Row, first: int | None, accepted: Accepted) -> int:
        return accepted.next_offset


class _Sent(Chain):
    """A stream writer's chunks in flight, counted on its event loop as their results come."""

    __slots__ = ("done", "_waiters")

    def __init__(self) -> None:
        super().__init__()
        self.done = 0  # chunks with their results
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def settled(self, count: int) -> None:
        self.done += count
        if self._waiters:
            for until, waiter in self._waiters:
                if self.done >= until and not waiter.done():
                    waiter.set_result(None)
            self._waiters = [(until, waiter) for until, waiter in self._waiters if not waiter.done()]

    def when(self, done: int) -> asyncio.Future[None]:
        """A future done once ``done`` chunks have their results."""
        waiter = asyncio.get_running_loop().create_future()
        if self.done < done:
            self._waiters.append((done, waiter))
        else:
            waiter.set_result(None)
        return waiter

    async def wait(self, done: int) -> None:
        """Until ``done`` chunks have their results."""
        if self.done < done:
            await self.when(done)


class StreamWriter:
    """Appends to one stream without waiting for each commit: ``send()`` queues a chunk and
    returns, ``flush()`` waits for everything sent and raises the first error. Chunks commit in
    the order they were sent. Make one with ``stream_writer()``."""

    def __init__(self, stream_id: Any, *, close: bool = False, using: str | None = None) -> None:
        self.stream_id = stream_uuid(stream_id)
        self._close = close
        self._alias = using or conf.database()
        self._chain = _Sent()
        self._last: Sends | None = None  # the chunks submitted last, which may take more, and
        self._into: Appender | None = None  # the appender they went to
        self.sent = 0

    async def send(self, data: str) -> None:
        """Queue ``data``; return at once, unless WRITER_IN_FLIGHT chunks wait for their commit
        (then wait for the oldest). Raises the first error of an earlier chunk, if one is known,
        so a loop stops writing to a stream that was closed under it."""
        chain = self._chain
        if chain.failure is not None:
            raise chain.failure
        writer.check_chunk(data, conf.max_chunk_bytes())
        if self.sent - chain.done >= WRITER_IN_FLIGHT:
            await chain.wait(self.sent - WRITER_IN_FLIGHT + 1)
            if chain.failure is not None:
                raise chain.failure
        target, last = appender(self._alias), self._last
        if last is None or target is not self._into or not target.extend(last, data):
            last = Sends(self.stream_id, None, asyncio.get_running_loop(), chain, gathered=[data], chars=len(data))
            target.submit(last)
            self._last, self._into = last, target
        self.sent += 1

    async def flush(self) -> None:
        """Wait until everything sent is committed; raise the first error if any chunk failed."""
        await self._chain.wait(self.sent)
        if self._chain.failure is not None:
            raise self._chain.failure

    async def __aenter__(self) -> StreamWriter:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # The close is queued now, before any await, behind every chunk sent: nothing that
        # happens to this task from here (a cancel at any await) can make it commit ahead of them.
        closing = self._queue_close() if self._close else None
        if exc is not None and not isinstance(exc, Exception):
            # Cancelled (or interrupted) in the block: let that go on at once. The chunks and
            # the close commit all the same; a failure of theirs is logged, nobody waits for it.
            self._report_later(closing)
            return
        try:
            await self._chain.wait(self.sent)
            if closing is not None:
                await asyncio.wait([closing])  # not cancelled with this task: _report_later reads it
        except asyncio.CancelledError:
            self._report_later(closing)
            raise
        if self._chain.failure is not None:
            raise self._chain.failure
        if closing is not None and (failure := closing.exception()) is not None:
            if not isinstance(failure, StreamClosed) or exc is None:
                raise failure

    def _queue_close(self) -> asyncio.Future[int]:
        """Submit the stream's close behind the chunks sent (in the appender that has them), and
        return the future of its result: the stream's chunk count."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        into, chain = self._into, self._chain
        item = _Close(self.stream_id, future, loop, chain)
        if into is not None and chain.done < self.sent:
            try:
                into.submit(item)  # behind them in its queue: committed with them or after
            except StreamError:  # stopped since: it settles them all the same, then the close goes
                chain.when(self.sent).add_done_callback(lambda _: self._submit_close(item, future))
        else:
            self._submit_close(item, future)
        return future

    def _submit_close(self, item: _Close, future: asyncio.Future[int]) -> None:
        try:
            appender(self._alias).submit(item)
        except StreamError as exc:  # the process's appender was stopped: say so at the exit
            if not future.done():
                future.set_exception(exc)

    def _report_later(self, closing: asyncio.Future[int] | None) -> None:
        """Log, once it is known, why a chunk sent or the close failed: the caller has gone."""
        chain, sid = self._chain, self.stream_id

        def chunks_settled(_: asyncio.Future[None]) -> None:
            if chain.failure is not None:
                logger.warning("pgstreams: stream %s: a chunk its cancelled writer sent failed: %s", sid, chain.failure)

        def closed(future: asyncio.Future[int]) -> None:
            failure = None if future.cancelled() else future.exception()
            if failure is not None and chain.failure is None and not isinstance(failure, StreamClosed):
                logger.warning("pgstreams: stream %s: its cancelled writer could not close it: %s", sid, failure)

        chain.when(self.sent).add_done_callback(chunks_settled)
        if closing is not None:
            closing.add_done_callback(closed)


def stream_writer(stream_id: Any, *, close: bool = False, using: str | None = None) -> StreamWriter:
    """A writer for a token loop: ``async with stream_writer(sid, close=True) as w: await w.send(t)``.

    ``send()`` queues without waiting for the commit (through the append path, so not part of
    any transaction); leaving the block waits for every chunk sent and raises the first error.
    With ``close=True`` the stream is closed on the way out, after every chunk sent (in the
    batch of the last ones or a later one, never ahead of them), also when the block raises, so
    its readers are not left waiting; not if a chunk sent failed (the stream stays open rather
    than look whole without it).

    A task cancelled in the block, or while its exit waits (as an ASGI server cancels a request
    whose client went away), ends cancelled at once; what it sent still commits, in order, then
    the close, and a failure of theirs, which nobody is left to raise it to, is logged.
    """
    return StreamWriter(stream_id, close=close, using=using)
