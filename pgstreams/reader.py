"""Read path: ``read()`` and ``aread()``, which yield a stream's chunks in order, exactly once.

The table is the truth: readers take chunks from this process's listener (which fetched them
from the table) and wait on it for more. No SQL here, and no database connection per reader.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any

from . import metrics
from .exceptions import ChunksPruned, ReadTimeout, StreamError, StreamNotFound
from .listener import END, MAX_OFFSET, Page, StreamChunk, get_listener
from .writer import stream_uuid


def _start_offset(from_offset: Any) -> int:
    if isinstance(from_offset, bool) or not isinstance(from_offset, int):
        raise TypeError(f"from_offset must be an int, not {type(from_offset).__name__}")
    if not 0 <= from_offset <= MAX_OFFSET:
        raise ValueError(f"from_offset must be between 0 and {MAX_OFFSET} (offsets are bigint), not {from_offset}")
    return from_offset


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, not {timeout!r}")


def _page_chunks(page: Page, stream_id: uuid.UUID, pos: int) -> list[StreamChunk]:
    if not page.exists:
        raise StreamNotFound(f"no stream {stream_id}")
    if page.pruned_to is not None:
        raise ChunksPruned(stream_id, pos, page.pruned_to)
    return page.chunks


class _Deadline:
    """The time left to wait for the next chunk; renewed whenever chunks arrive."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.renew()

    def renew(self) -> None:
        self.at = None if self.timeout is None else time.monotonic() + self.timeout

    def left(self, stream_id: uuid.UUID) -> float | None:
        if self.at is None:
            return None
        left = self.at - time.monotonic()
        if left <= 0:
            raise ReadTimeout(f"no chunk from stream {stream_id} within {self.timeout} s")
        return left


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
    listener = get_listener()
    tail = listener.attach(sid)
    metrics.readers.inc()
    deadline = _Deadline(timeout)
    try:
        while True:
            step = listener.step(tail, pos, None)
            if step is END:
                return
            if isinstance(step, list):
                chunks = step
            elif isinstance(step, concurrent.futures.Future):
                try:
                    chunks = _page_chunks(step.result(deadline.left(sid)), sid, pos)
                except concurrent.futures.TimeoutError:
                    raise ReadTimeout(f"no chunk from stream {sid} within {timeout} s") from None
            else:
                assert isinstance(step, threading.Event)
                if not step.wait(deadline.left(sid)):
                    deadline.left(sid)  # raises ReadTimeout
                continue
            if chunks:
                yield chunks
                pos = chunks[-1].offset + 1
                deadline.renew()
    finally:
        listener.detach(tail)
        metrics.readers.dec()


async def aread(stream_id: Any, *, from_offset: int = 0, timeout: float | None = None) -> AsyncIterator[StreamChunk]:
    """``read()`` for async code: the same semantics, and it never blocks the event loop."""
    batches = aread_batches(stream_id, from_offset=from_offset, timeout=timeout)
    try:
        async for batch in batches:
            for chunk in batch:
                yield chunk
    finally:
        await batches.aclose()


async def aread_batches(
    stream_id: Any, *, from_offset: int = 0, timeout: float | None = None
) -> AsyncIterator[list[StreamChunk]]:
    """``aread()`` in batches: each a non-empty list of the consecutive chunks available at once."""
    sid = stream_uuid(stream_id)
    pos = _start_offset(from_offset)
    _check_timeout(timeout)
    loop = asyncio.get_running_loop()
    listener = get_listener()
    tail = listener.attach(sid)
    metrics.readers.inc()
    deadline = _Deadline(timeout)
    try:
        while True:
            step = listener.step(tail, pos, loop)
            if step is END:
                return
            if isinstance(step, list):
                chunks = step
            else:
                if isinstance(step, concurrent.futures.Future):
                    waitable: Awaitable[Any] = asyncio.wrap_future(step)
                else:
                    assert isinstance(step, asyncio.Event)
                    waitable = step.wait()
                try:
                    result = await asyncio.wait_for(waitable, deadline.left(sid))
                except TimeoutError:
                    raise ReadTimeout(f"no chunk from stream {sid} within {timeout} s") from None
                if not isinstance(result, Page):
                    continue
                chunks = _page_chunks(result, sid, pos)
            if chunks:
                yield chunks
                pos = chunks[-1].offset + 1
                deadline.renew()
    finally:
        listener.detach(tail)
        metrics.readers.dec()
