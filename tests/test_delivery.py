"""The fans of ``delivery``: subscribers of one stream at its tail in one event loop share one
task that steps through each round for them all, get every chunk once and in order, hear a
keepalive when the stream is silent, and are handed back to read by themselves, losing nothing,
when they fall behind."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from asgiref.sync import sync_to_async
from django.db import transaction

import pgstreams
from pgstreams import delivery, listener

pytestmark = pytest.mark.django_db(transaction=True)


async def take_chunks(follow, n: int) -> list[tuple[int, str]]:
    """The next ``n`` chunks of ``follow`` (keepalives skipped), as (offset, data)."""
    got: list[tuple[int, str]] = []
    while len(got) < n:
        progress = await asyncio.wait_for(anext(follow), 10)
        got += [(c.offset, c.data) for c in progress.chunks]
    return got


async def test_subscribers_at_the_tail_share_one_fan_and_each_get_every_chunk_once_in_order() -> None:
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite(s.id, "before")
    follows = [delivery.afollow(s.id) for _ in range(5)]
    try:
        assert [await take_chunks(f, 1) for f in follows] == [[(0, "before")]] * 5
        pending = [asyncio.ensure_future(take_chunks(f, 30)) for f in follows]
        await asyncio.sleep(0.05)  # each is at the tail, waiting
        fan = delivery._fans[asyncio.get_running_loop()][s.id]
        assert len(fan.followers) == 5
        for i in range(30):
            await pgstreams.awrite(s.id, f"c{i}")
        want = [(i + 1, f"c{i}") for i in range(30)]
        assert await asyncio.gather(*pending) == [want] * 5
    finally:
        for f in follows:
            await f.aclose()
    # The last to leave ended it, and it follows the stream no more.
    assert fan.done and s.id not in delivery._fans.get(asyncio.get_running_loop(), {})
    assert s.id not in listener.get_listener()._tails


async def test_a_subscriber_at_the_fan_hears_keepalives_while_the_stream_is_silent_and_then_its_chunks() -> None:
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite(s.id, "first")
    follow = delivery.afollow(s.id, idle=0.2)
    try:
        assert (await anext(follow)).chunks[0].data == "first"
        waited = asyncio.get_running_loop().time()
        for _ in range(3):  # each after between one and two idle intervals
            assert (await asyncio.wait_for(anext(follow), 2)).chunks == []
        assert asyncio.get_running_loop().time() - waited >= 0.6
        assert s.id in delivery._fans[asyncio.get_running_loop()]  # heard at the fan, not read anew
        await pgstreams.awrite(s.id, "after the silence")
        assert await take_chunks(follow, 1) == [(1, "after the silence")]
    finally:
        await follow.aclose()


async def test_a_subscriber_that_does_not_come_for_its_chunks_is_handed_back_and_loses_none(monkeypatch) -> None:
    monkeypatch.setattr(delivery, "INBOX_CHUNKS", 3)
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite(s.id, "c0")
    slow, quick = delivery.afollow(s.id), delivery.afollow(s.id)
    try:
        assert await take_chunks(slow, 1) == await take_chunks(quick, 1) == [(0, "c0")]
        reading = asyncio.ensure_future(take_chunks(quick, 40))
        for i in range(1, 41):  # one at a time: each its own round, past the slow one's inbox
            await pgstreams.awrite(s.id, f"c{i}")
            await asyncio.sleep(0.005)
        want = [(i, f"c{i}") for i in range(1, 41)]
        assert await reading == want
        assert await take_chunks(slow, 40) == want  # read by itself from where its inbox ended
    finally:
        for f in (slow, quick):
            with contextlib.suppress(Exception):
                await f.aclose()


async def test_a_fan_that_ends_while_another_reader_keeps_the_stream_followed_is_called_back_no_more() -> None:
    """Subscribers come and go on a quiet stream that another reader keeps followed: each fan
    ended is taken off the tail at once, not kept until the stream's next chunk."""
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite(s.id, "c0")
    other = pgstreams.aread(s.id, from_offset=1)
    waiting = asyncio.ensure_future(anext(other))  # keeps the tail while it waits
    try:
        for _ in range(3):
            follow = delivery.afollow(s.id)
            assert (await take_chunks(follow, 1)) == [(0, "c0")]
            pending = asyncio.ensure_future(anext(follow))
            await asyncio.sleep(0.05)  # at the fan, which waits for the tail
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
            await follow.aclose()
        tail = listener.get_listener()._tails[s.id]
        assert tail.pushes == {} and s.id not in delivery._fans.get(asyncio.get_running_loop(), {})
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await other.aclose()


async def test_a_followers_send_cancelled_hands_its_fan_back_and_another_streams_fan_still_gets_its_round() -> None:
    """The listener calls the fans of one round in one callback: one whose follower raises a
    cancellation hands its followers back to read by themselves, and the next fan still steps."""
    streams = [await pgstreams.acreate_stream() for _ in range(2)]

    class Raising:
        position = 0

        def take(self, progress) -> bool:
            raise asyncio.CancelledError

    class Taking:
        def __init__(self) -> None:
            self.position = 0
            self.got: list[int] = []

        def take(self, progress) -> bool:
            self.got += [c.offset for c in progress.chunks]
            self.position = progress.chunks[-1].offset + 1
            return True

    raising, taking = Raising(), Taking()
    handed = delivery.join(streams[0].id, raising)
    taken = delivery.join(streams[1].id, taking)
    await asyncio.sleep(0.05)  # each at its fan, which waits for its tail

    @sync_to_async
    def write_both() -> None:  # one commit: both streams in one fetch, both fans in one callback, in this order
        with transaction.atomic():
            pgstreams.write(streams[0].id, "a")
            pgstreams.write(streams[1].id, "b")

    await write_both()
    assert await asyncio.wait_for(handed, 10) is None  # handed back, to read by itself
    for _ in range(200):
        if taking.got:
            break
        await asyncio.sleep(0.01)
    assert taking.got == [0]
    delivery.leave(streams[1].id, taking)
    assert taken.result() is None
    assert delivery._fans.get(asyncio.get_running_loop(), {}) == {}


async def test_a_followers_send_cancelled_while_its_fan_hands_out_a_page_it_awaited_ends_the_fan_all_the_same() -> None:
    """A fan's first step on a stream no reader here has read is a page it awaits in a task; a
    follower whose send is cancelled there hands the fan back as on any round, and the fan stops
    following the stream, rather than being stranded with its task gone."""
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite(s.id, "stored")

    class Raising:
        position = 0

        def take(self, progress) -> bool:
            raise asyncio.CancelledError

    handed = delivery.join(s.id, Raising())
    assert await asyncio.wait_for(handed, 10) is None
    assert delivery._fans.get(asyncio.get_running_loop(), {}) == {}
    assert s.id not in listener.get_listener()._tails
