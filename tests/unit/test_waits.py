"""A reader's waits (waits.py) cancelled in every loop turn around the one their wait ends in:
the cancel always wins. On Python 3.11, ``asyncio.wait_for`` returned the result instead when
its inner wait had finished in the same turn as the cancel. Pure asyncio, no database."""

from __future__ import annotations

import asyncio
import concurrent.futures
import uuid
from collections.abc import Awaitable, Callable

import pytest

from pgstreams.waits import ForPage, ForTail, Left
from pgstreams.window import Page

TURNS = 6  # loop turns after the wait ends in which to cancel it: more than any wait takes to resume


def timed(seconds: float | None) -> Left:
    return lambda: seconds


async def cancels_kept(wait: Callable[[], Awaitable[object]], end: Callable[[], None]) -> list[bool]:
    """Start ``wait()``, let it wait, end its wait with ``end()`` and cancel it 0, 1, ... loop
    turns later, while it has not returned: whether each cancel was kept (the wait ended
    cancelled, not with its outcome)."""
    kept = []
    for turn in range(TURNS):
        task = asyncio.create_task(wait())
        await asyncio.sleep(0)  # it waits now
        end()
        for _ in range(turn):
            await asyncio.sleep(0)
        if task.done():
            break  # it has returned: later turns are too late to cancel it
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        kept.append(task.cancelled())
    return kept


@pytest.mark.parametrize("timeout", [30.0, None])
async def test_a_tail_wait_cancelled_in_any_turn_around_its_wake_up_is_cancelled(timeout: float | None) -> None:
    events: list[asyncio.Event] = []

    def wait() -> Awaitable[object]:
        events.append(asyncio.Event())
        return ForTail(events[-1]).take_async(timed(timeout))

    kept = await cancels_kept(wait, lambda: events[-1].set())
    assert kept and all(kept), kept


@pytest.mark.parametrize("timeout", [30.0, None])
async def test_a_page_wait_cancelled_in_any_turn_around_its_answer_is_cancelled(timeout: float | None) -> None:
    futures: list[concurrent.futures.Future[Page]] = []

    def wait() -> Awaitable[object]:
        futures.append(concurrent.futures.Future())
        return ForPage(futures[-1], uuid.uuid4(), 0).take_async(timed(timeout))

    kept = await cancels_kept(wait, lambda: futures[-1].set_result(Page(exists=True)))
    assert kept and all(kept), kept


async def test_a_wait_cancelled_before_its_answer_cancels_the_request_it_made() -> None:
    future: concurrent.futures.Future[Page] = concurrent.futures.Future()
    task = asyncio.create_task(ForPage(future, uuid.uuid4(), 0).take_async(timed(30.0)))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled() and future.cancelled()  # the listener's answer to it is dropped (settle())


async def test_waits_that_outlast_their_time_raise_timeout_error() -> None:
    event = asyncio.Event()
    with pytest.raises(TimeoutError):
        await ForTail(event).take_async(timed(0.01))
    assert not event._waiters  # type: ignore[attr-defined]  # its wait was taken back
    future: concurrent.futures.Future[Page] = concurrent.futures.Future()
    with pytest.raises(TimeoutError):
        await ForPage(future, uuid.uuid4(), 0).take_async(timed(0.01))
    assert future.cancelled()


async def test_a_wait_that_ends_in_time_returns_what_it_waited_for() -> None:
    event = asyncio.Event()
    asyncio.get_running_loop().call_soon(event.set)
    assert await ForTail(event).take_async(timed(30.0)) == []
    future: concurrent.futures.Future[Page] = concurrent.futures.Future()
    asyncio.get_running_loop().call_soon(future.set_result, Page(exists=True))
    assert await ForPage(future, uuid.uuid4(), 0).take_async(timed(30.0)) == []
