"""The append path's Python API: ``append``, ``aappend`` and ``stream_writer``. Each checks its
chunk and hands the process's appender (``appender``) an item, ``Append`` for a call and
``Sends`` for a stream writer's chunks, gathered while they wait; the appender commits them in
batches and settles them. Here: how a caller waits (a thread's future, an event loop's future,
or a writer's count of chunks settled, with at most WRITER_IN_FLIGHT in flight) and what it
raises. No SQL and no thread of its own."""

from __future__ import annotations

import asyncio
import concurrent.futures
from types import TracebackType
from typing import Any, Final

from . import conf, producers, writer
from .appender import Appender, appender
from .batch import Append, Chain, Sends
from .exceptions import StreamClosed
from .types import Producer, stream_uuid

# Chunks a stream writer may have sent and not yet seen committed before send() waits.
WRITER_IN_FLIGHT: Final = 1000


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

    async def wait(self, done: int) -> None:
        """Until ``done`` chunks have their results."""
        if self.done < done:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append((done, waiter))
            await waiter


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
        try:
            await self.flush()
        finally:
            if self._close:
                try:
                    await writer.aclose(self.stream_id, using=self._alias)
                except StreamClosed:
                    if exc is None and self._chain.failure is None:
                        raise


def stream_writer(stream_id: Any, *, close: bool = False, using: str | None = None) -> StreamWriter:
    """A writer for a token loop: ``async with stream_writer(sid, close=True) as w: await w.send(t)``.

    ``send()`` queues without waiting for the commit (through the append path, so not part of
    any transaction); leaving the block waits for every chunk sent and raises the first error.
    With ``close=True`` the stream is closed on the way out, also when the block raises, so its
    readers are not left waiting.
    """
    return StreamWriter(stream_id, close=close, using=using)
