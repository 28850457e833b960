"""Cancelling a reader, with a timeout, at any await of its read: the cancel always wins. On
Python 3.11 a timed ``aread()`` cancelled in the loop turn its wait ended in went on reading and
returned normally (``asyncio.wait_for`` swallowed the cancel). Here against the real listener
and a stream written as it is read; tests/unit/test_waits.py holds each wait to it turn by turn."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest
from django.db import connections

import pgstreams

pytestmark = pytest.mark.django_db(transaction=True)

# When to cancel a reader: after 0.1 ms times 0 to DELAYS - 1 (the writer writes every 2 ms), then
# 0 to TURNS - 1 turns of the loop.
DELAYS = 10
TURNS = 12
LIMIT = 50  # chunks a reader takes, then returns: what a swallowed cancel shows as


class Writer:
    """A thread that writes a chunk to a stream every 2 ms, each in its own transaction."""

    def __init__(self, stream_id: uuid.UUID) -> None:
        self.stream_id = stream_id
        self.written = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="test-writer")

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                pgstreams.write(self.stream_id, "x")
                self.written += 1
                time.sleep(0.002)
        finally:
            connections.close_all()

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


async def read_some(stream_id: uuid.UUID, from_offset: int) -> int:
    taken = 0
    async for _ in pgstreams.aread(stream_id, from_offset=from_offset, timeout=30):
        taken += 1
        if taken == LIMIT:
            break
    return taken


async def test_a_timed_aread_cancelled_at_any_turn_of_a_live_read_is_always_cancelled() -> None:
    s = await pgstreams.acreate_stream()
    swallowed, cancelled = [], 0
    with Writer(s.id) as writer:
        for delay in range(DELAYS):
            for turns in range(TURNS):
                # From the start (catching up: page waits) and from the tail (live: tail waits).
                for start in (0, writer.written):
                    task = asyncio.create_task(read_some(s.id, start))
                    await asyncio.sleep(delay / 10_000)
                    for _ in range(turns):
                        await asyncio.sleep(0)
                    if task.done():
                        continue  # it read its chunks before the cancel
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    cancelled += 1
                    if not task.cancelled():
                        swallowed.append((delay, turns, start))
    assert cancelled > DELAYS * TURNS  # most cancels came while it read
    assert swallowed == [], f"{len(swallowed)} of {cancelled} cancels swallowed (delay, turns, start): {swallowed}"
