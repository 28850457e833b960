"""Read path: ``read()`` and ``aread()``, which yield a stream's chunks in order, exactly once.

The table is the truth: readers take chunks from this process's listener (which fetched them
from the table) and wait on it for more. A reader asks the listener for its next step
(waits.py) and takes it, from its thread or its event loop: the only difference between the
two (a third way, ``Reading.push_next``, is delivery's fans': called back instead of waiting).
No SQL here, and no database connection per reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from . import metrics
from .exceptions import ReadTimeout, StreamError
from .listener import get_listener
from .types import MAX_OFFSET, StreamChunk, stream_uuid
from .waits import Step
from .window import Push


def _start_offset(from_offset: Any) -> int:
    if isinstance(from_offset, bool) or not isinstance(from_offset, int):
        raise TypeError(f"from_offset must be an int, not {type(from_offset).__name__}")
    if not 0 <= from_offset <= MAX_OFFSET:
        raise ValueError(f"from_offset must be between 0 and {MAX_OFFSET} (offsets are bigint), not {from_offset}")
    return from_offset


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, not {timeout!r}")


class Reading:
    """One reader's place in a stream while it reads: attached to the listener's tail, with its
    position and the deadline for its next chunk (renewed whenever chunks arrive). A wait that
    outlasts the deadline leaves the ``with`` block as ``ReadTimeout``."""

    def __init__(self, stream_id: uuid.UUID, pos: int, timeout: float | None, loop: asyncio.AbstractEventLoop | None):
        self.stream_id, self.pos, self.timeout, self.loop = stream_id, pos, timeout, loop
        self.listener = get_listener()
        self.tail = self.listener.attach(stream_id)
        metrics.readers.inc()
        self.deadline = self._deadline()

    def __enter__(self) -> Reading:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
        if kind is not None and issubclass(kind, TimeoutError) and not isinstance(error, ReadTimeout):
            raise ReadTimeout(f"no chunk from stream {self.stream_id} within {self.timeout} s") from None

    def close(self, push: Push | None = None) -> None:
        """Stop following the stream, as ``push`` if it stepped as one; call it once."""
        self.listener.detach(self.tail, push)
        metrics.readers.dec()

    def _deadline(self) -> float | None:
        return None if self.timeout is None else time.monotonic() + self.timeout

    def renew(self) -> None:
        """The caller is back for more: the time to wait for the next chunk starts now."""
        self.deadline = self._deadline()

    def next(self) -> Step:
        return self.listener.step(self.tail, self.pos, self.loop)

    def push_next(self, push: Push) -> Step | None:
        """``next()``, or None: then ``push.set()`` is called once the tail moves."""
        return self.listener.push_step(self.tail, self.pos, push)

    def left(self) -> float | None:
        """How long a wait may last now; TimeoutError if the time is up already."""
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        return left

    def took(self, chunks: list[StreamChunk] | None) -> list[StreamChunk] | None:
        """Note what a step gave (None: the end) and pass it on."""
        if chunks:
            self.pos = chunks[-1].offset + 1
        return chunks

    def progress(self, chunks: list[StreamChunk]) -> Progress:
        """Chunks just taken, with what is known of the stream now."""
        tail = self.tail
        closed = tail.final is not None and self.pos >= tail.final
        return Progress(chunks, self.pos >= tail.hint, closed, sum(len(chunk.data) for chunk in chunks))


def read(stream_id: Any, *, from_offset: int = 0, timeout: float | None = None) -> Iterator[StreamChunk]:
    """Yield every chunk with offset >= ``from_offset``, in order, exactly once; return once the
    stream is closed and every chunk was yielded.

    Args:
        stream_id: a stream's id (UUID or str) or the Stream itself.
        from_offset: where to start, e.g. one past the last offset a client saw.
        timeout: seconds to wait for each next chunk; ``ReadTimeout`` when it passes.

    Raises:
        StreamNotFound: no such stream, or it was deleted while being read.
        ChunksPruned: chunks it was about to yield were deleted; ``first_offset`` says where
            reading can resume.

    Blocks the calling thread; in async code use ``aread()``.
    """
    sid = stream_uuid(stream_id)
    start = _start_offset(from_offset)
    _check_timeout(timeout)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _read(sid, start, timeout)
    raise StreamError("read() would block this event loop; use 'async for chunk in aread(...)' instead")


def _read(sid: uuid.UUID, pos: int, timeout: float | None) -> Iterator[StreamChunk]:
    # closing(): a reader dropped half-way detaches from the listener at once.
    with contextlib.closing(_read_batches(sid, pos, timeout)) as batches:
        for batch in batches:
            yield from batch


def _read_batches(sid: uuid.UUID, pos: int, timeout: float | None) -> Iterator[list[StreamChunk]]:
    with Reading(sid, pos, timeout, None) as reading:
        while (chunks := reading.took(reading.next().take(reading.left))) is not None:
            if chunks:  # empty: the wait is over, ask again
                yield chunks
                reading.renew()


async def aread(stream_id: Any, *, from_offset: int = 0, timeout: float | None = None) -> AsyncIterator[StreamChunk]:
    """``read()`` for async code: the same semantics, and it never blocks the event loop."""
    async with contextlib.aclosing(aread_batches(stream_id, from_offset=from_offset, timeout=timeout)) as batches:
        async for batch in batches:
            for chunk in batch:
                yield chunk


async def aread_batches(
    stream_id: Any, *, from_offset: int = 0, timeout: float | None = None
) -> AsyncIterator[list[StreamChunk]]:
    """``aread()`` in batches: each a non-empty list of the consecutive chunks available at once."""
    async with contextlib.aclosing(afollow(stream_id, from_offset=from_offset, timeout=timeout)) as batches:
        async for progress in batches:
            yield progress.chunks


@dataclass(frozen=True, slots=True)
class Progress:
    """A batch of chunks, and what this process knew of the stream when it handed them out."""

    chunks: list[StreamChunk]
    caught_up: bool  # no chunk after these was known to exist
    closed: bool  # the stream is closed and these are its last chunks
    size: int  # of the chunks' data (characters of text, bytes): summed once, for all who take it


async def afollow(
    stream_id: Any, *, from_offset: int = 0, timeout: float | None = None, idle: float | None = None
) -> AsyncIterator[Progress]:
    """``aread_batches()``, each batch saying whether the reader has caught up and whether the
    stream ended with it (for protocols that tell their clients so). With ``idle`` (instead of
    ``timeout``), a wait that long yields an empty batch and the reader stays attached: the caller
    can keep its client's connection open without following the stream anew."""
    if timeout is not None and idle is not None:
        raise ValueError("give afollow() a timeout or an idle interval, not both")
    sid = stream_uuid(stream_id)
    pos = _start_offset(from_offset)
    _check_timeout(idle if idle is not None else timeout)
    with Reading(sid, pos, idle if idle is not None else timeout, asyncio.get_running_loop()) as reading:
        while True:
            try:
                chunks = reading.took(await reading.next().take_async(reading.left))
            except TimeoutError:
                if idle is None:
                    raise
                yield Progress([], caught_up=True, closed=False, size=0)
                reading.renew()
                continue
            if chunks is None:
                return
            if chunks:  # empty: the wait is over, ask again
                yield reading.progress(chunks)
                reading.renew()
                del chunks  # not held while the next step waits: it would reach the collector's oldest generation
