"""What a reader does next, as ``Listener.step()`` tells it: take chunks, stop at the stream's
end, or wait, for a page only its position needs or for the stream's tail to move.

Every step is taken the same two ways: ``take(left)`` from a thread, ``await take_async(left)``
from an event loop. Both return the chunks to hand out (an empty list: ask for the next step),
or None at the end. A step that waits asks ``left()`` how long it may (None: for ever; it
raises ``TimeoutError`` once the time is up) and raises ``TimeoutError`` when the wait outlasts
it; a step that does not wait never asks. The listener settles and wakes the waits with
``settle()`` and ``wake()``.

A wait is bounded with ``asyncio.timeout()``, never ``asyncio.wait_for()``: on Python 3.11 that
returned the wait's result, swallowing the cancel, when the task was cancelled in the loop turn
its wait ended in (tests/unit/test_waits.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

from .exceptions import ChunksPruned, StreamNotFound
from .types import StreamChunk
from .window import Event, Page, Waiter

Left = Callable[[], float | None]  # how long a wait may last


class Step(Protocol):
    def take(self, left: Left) -> list[StreamChunk] | None: ...

    async def take_async(self, left: Left) -> list[StreamChunk] | None: ...


@dataclass(frozen=True, slots=True)
class Ready:
    """Chunks from the tail's window, to hand out at once."""

    chunks: list[StreamChunk]

    def take(self, left: Left) -> list[StreamChunk]:
        return self.chunks

    async def take_async(self, left: Left) -> list[StreamChunk]:
        return self.chunks


class _End:
    """The stream is closed and the reader has every chunk."""

    def take(self, left: Left) -> None:
        return None

    async def take_async(self, left: Left) -> None:
        return None


END: Final = _End()


@dataclass(frozen=True, slots=True)
class ForPage:
    """A page that only this reader's position needs (it is behind the window, or the tail has
    none yet); readers asking for the same page share its fetch."""

    future: concurrent.futures.Future[Page]
    stream_id: uuid.UUID
    pos: int

    def take(self, left: Left) -> list[StreamChunk]:
        return self._chunks(self.future.result(left()))

    async def take_async(self, left: Left) -> list[StreamChunk]:
        # Cancelled or out of time, the await cancels the request (settle() drops its answer).
        async with asyncio.timeout(left()):
            page = await asyncio.wrap_future(self.future)
        return self._chunks(page)

    def _chunks(self, page: Page) -> list[StreamChunk]:
        if not page.exists:
            raise StreamNotFound(f"no stream {self.stream_id}")
        if page.pruned_to is not None:
            raise ChunksPruned(self.stream_id, self.pos, page.pruned_to)
        return page.chunks(self.stream_id, self.pos)


@dataclass(frozen=True, slots=True)
class ForTail:
    """The tail to move (chunks arrive, the stream ends or is deleted); then step again."""

    event: Event

    def take(self, left: Left) -> list[StreamChunk]:
        assert isinstance(self.event, threading.Event)
        if not self.event.wait(left()):
            raise TimeoutError
        return []

    async def take_async(self, left: Left) -> list[StreamChunk]:
        assert isinstance(self.event, asyncio.Event)
        timeout = left()
        if timeout is None:
            await self.event.wait()
        else:
            async with asyncio.timeout(timeout):
                await self.event.wait()
        return []


def settle(future: concurrent.futures.Future[Page], outcome: Page | BaseException) -> None:
    """Settle a reader's request; a reader that gave up has cancelled it, and that is fine."""
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except concurrent.futures.InvalidStateError:
        pass


def wake(waiters: list[tuple[asyncio.AbstractEventLoop | None, Waiter]]) -> None:
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
