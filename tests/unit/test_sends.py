"""``delivery.start()``: a server's send run until it first waits, then finished by a task of its
own, as a fan sends to each follower without waiting for any. Pure asyncio, no server."""

from __future__ import annotations

import asyncio

import pytest

from pgstreams import delivery


class Socket:
    """A send that waits while the socket is not writable, as uvicorn's does for a client that
    does not read (``await self.writable.wait()``), and records what it sent."""

    def __init__(self, writable: bool) -> None:
        self.writable = asyncio.Event()
        if writable:
            self.writable.set()
        self.sent: list[str] = []

    async def send(self, message: str) -> None:
        await self.writable.wait()
        self.sent.append(message)


async def test_a_send_that_does_not_wait_is_done_at_once() -> None:
    socket = Socket(writable=True)
    assert delivery.start(socket.send("a")) is None
    assert socket.sent == ["a"]


async def test_a_send_that_waits_is_finished_by_its_task_once_the_socket_is_writable() -> None:
    """It failed with "await wasn't used with future" (asyncio's futures are implemented in C):
    the consumer took the socket for broken and sent it nothing more."""
    socket = Socket(writable=False)
    task = delivery.start(socket.send("a"))
    assert task is not None
    await asyncio.sleep(0)
    assert not task.done() and socket.sent == []
    socket.writable.set()
    await task
    assert socket.sent == ["a"]


async def test_a_send_whose_task_is_cancelled_while_it_waits_is_cancelled() -> None:
    socket = Socket(writable=False)
    task = delivery.start(socket.send("a"))
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    socket.writable.set()
    await asyncio.sleep(0)
    assert socket.sent == []
