"""The read API in one process: order, resume, end, waiting, sharing and the fallback poll."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
import uuid

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.test import override_settings

import pgstreams
from pgstreams import conf, db, fetch, listener, notify, window
from pgstreams.models import Stream
from pgstreams.types import Mark
from tests.helpers import delete_chunks

pytestmark = pytest.mark.django_db(transaction=True)


def pairs(chunks) -> list[tuple[int, str]]:
    return [(c.offset, c.data) for c in chunks]


def pgstreams_backends() -> dict[str, int]:
    """This process's pgstreams connections, by role, as Postgres sees them."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT split_part(application_name, ' ', 2), count(*) FROM pg_stat_activity"
            " WHERE application_name LIKE %s GROUP BY 1",
            [f"pgstreams % {os.getpid()}"],
        )
        return dict(cursor.fetchall())


def test_read_yields_everything_in_order_then_ends_at_close() -> None:
    s = pgstreams.create_stream()
    pgstreams.write_many(s.id, [f"c{i}" for i in range(10)])
    pgstreams.close(s.id)
    chunks = list(pgstreams.read(s.id, timeout=10))
    assert pairs(chunks) == [(i, f"c{i}") for i in range(10)]
    assert all(c.stream_id == s.id and c.created_at.tzinfo is not None for c in chunks)


def test_resume_from_any_offset() -> None:
    s = pgstreams.create_stream()
    pgstreams.write_many(s.id, [f"c{i}" for i in range(10)])
    pgstreams.close(s.id)
    assert pairs(pgstreams.read(s.id, from_offset=7, timeout=10)) == [(7, "c7"), (8, "c8"), (9, "c9")]
    assert list(pgstreams.read(s.id, from_offset=10, timeout=10)) == []
    assert list(pgstreams.read(s.id, from_offset=50, timeout=10)) == []


def test_a_long_stream_is_read_in_pages_past_the_window() -> None:
    s = pgstreams.create_stream()
    n = conf.window_bytes() // window.CHUNK_OVERHEAD + 3 * fetch.PAGE_SIZE + 7
    for start in range(0, n, 1000):
        pgstreams.write_many(s.id, [str(i) for i in range(start, min(n, start + 1000))])
    pgstreams.close(s.id)
    before = listener.get_listener().stats.chunks_fetched
    reader = pgstreams.read(s.id, timeout=30)
    first = next(reader)
    time.sleep(0.5)  # a slow reader: the window must not race ahead and be read twice
    assert [first.data] + [c.data for c in reader] == [str(i) for i in range(n)]
    # Each chunk is fetched about once.
    assert listener.get_listener().stats.chunks_fetched - before <= n + 2 * fetch.PAGE_SIZE


def write_numbered(stream_id: uuid.UUID, n: int) -> None:
    for start in range(0, n, 1000):
        pgstreams.write_many(stream_id, [str(i) for i in range(start, min(n, start + 1000))])


@pytest.mark.usefixtures("fresh_listener")
def test_a_reader_resuming_ahead_of_another_readers_window_fetches_only_its_own_chunks() -> None:
    """A reader behind the window fetches its own pages, and so does one ahead of it: it fetched
    everything between the window and itself, a page a round (99,500 chunks for 5)."""
    s = pgstreams.create_stream()
    n = 20 * fetch.PAGE_SIZE
    write_numbered(s.id, n)
    pgstreams.close(s.id)
    behind = pgstreams.read(s.id, timeout=10)
    assert next(behind).offset == 0  # its window is at the start, and stays there while it pauses
    hub = listener.get_listener()
    before = hub.stats.snapshot()
    assert pairs(pgstreams.read(s.id, from_offset=n - 5, timeout=10)) == [(i, str(i)) for i in range(n - 5, n)]
    ahead = hub.stats - before
    # Its 5 chunks in a round, and a page more if the fallback poll came meanwhile.
    assert ahead.chunks_fetched <= 5 + fetch.PAGE_SIZE and ahead.fetches <= 3, ahead
    assert [c.offset for c in behind] == list(range(1, n))  # the one behind reads on, by its own pages


@pytest.mark.usefixtures("fresh_listener")
def test_a_reader_waiting_at_the_tail_ahead_of_the_window_does_not_pull_the_window_through_the_stream() -> None:
    s = pgstreams.create_stream()
    n = 20 * fetch.PAGE_SIZE
    write_numbered(s.id, n)
    behind = pgstreams.read(s.id, timeout=10)
    assert next(behind).offset == 0
    hub = listener.get_listener()
    before = hub.stats.snapshot()
    got: list[tuple[int, str]] = []
    reader = threading.Thread(target=lambda: got.extend(pairs(pgstreams.read(s.id, from_offset=n, timeout=10))))
    reader.start()
    pgstreams.write(s.id, "live")
    pgstreams.close(s.id)
    reader.join(15)
    assert got == [(n, "live")]
    ahead = hub.stats - before
    assert ahead.chunks_fetched <= 1 + fetch.PAGE_SIZE, ahead
    assert [c.offset for c in behind] == list(range(1, n + 1))


@pytest.mark.usefixtures("fresh_listener")
async def test_a_page_fetched_before_a_reader_came_is_not_all_it_is_told(monkeypatch) -> None:
    """A page asked for by readers that then left, handed to a reader that came while it was
    fetched, at the same offset: a chunk committed meanwhile was announced to no one (the stream
    had no tail here then), and the page predates it. The reader waited for the fallback poll."""
    fetched, release = threading.Event(), threading.Event()
    fetch_pages = fetch.fetch_pages
    held: list[list[fetch.Key]] = []

    async def held_once(conn, keys, refuse):  # the real fetch; the first one's answer held back
        pages = await fetch_pages(conn, keys, refuse)
        if not held:
            held.append(keys)
            fetched.set()
            while not release.is_set():  # bounded by the test, which sets it
                await asyncio.sleep(0.001)
        return pages

    monkeypatch.setattr(fetch, "fetch_pages", held_once)
    with override_settings(PGSTREAMS={"NOTIFY_MODE": "off", "POLL_INTERVAL": 3600}):
        s = await pgstreams.acreate_stream()
        hub = listener.get_listener()
        first = asyncio.create_task(anext(pgstreams.aread(s.id, timeout=10)))
        assert await asyncio.to_thread(fetched.wait, 10)  # its page is fetched, not yet handed out
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        assert s.id not in hub._tails  # it left: the stream is followed by no one here
        await pgstreams.awrite(s.id, "committed after the page's snapshot")
        second = asyncio.create_task(anext(pgstreams.aread(s.id, timeout=10)))
        await asyncio.sleep(0)
        assert (s.id, 0) in hub._requests  # it asks for the page being fetched
        release.set()
        assert (await second).data == "committed after the page's snapshot"
        assert hub.stats.polls == 0


def test_a_page_ends_with_the_chunk_that_reaches_its_bytes_whatever_the_chunks_size() -> None:
    """Pages were 500 chunks whatever their size: 32 MB of 64 KB chunks for a reader that
    would send one MiB of it."""
    s = pgstreams.create_stream()
    big = "é" * (32 << 10)  # 64 KiB of UTF-8 in 32 Ki characters: pages count bytes
    pgstreams.write_many(s.id, [big] * 10 + ["small"] * 10)

    async def fetched(keys: list[fetch.Key]) -> dict[fetch.Key, window.Page]:
        conn = await db.aconnect(conf.database(), "test")
        try:
            return await fetch.fetch_pages(conn, keys, refuse=lambda key, exc: pytest.fail(str(exc)))
        finally:
            await conn.close()

    pages = asyncio.run(fetched([(s.id, 0), (s.id, 8), (s.id, 19)]))
    per_page = fetch.PAGE_BYTES // len(big.encode())
    assert [c.offset for c in pages[s.id, 0].chunks(s.id, 0)] == list(range(per_page))
    assert [c.offset for c in pages[s.id, 8].chunks(s.id, 8)] == list(range(8, 20))  # under the bytes: to the end
    assert [c.data for c in pages[s.id, 19].chunks(s.id, 19)] == ["small"]


def test_a_waiting_reader_gets_live_writes_and_the_end() -> None:
    s = pgstreams.create_stream()
    got: list[tuple[int, str]] = []
    reader = threading.Thread(target=lambda: got.extend(pairs(pgstreams.read(s.id, timeout=10))))
    reader.start()
    for i in range(20):
        pgstreams.write(s.id, f"live{i}")
        time.sleep(0.002)
    pgstreams.close(s.id)
    reader.join(15)
    assert not reader.is_alive()
    assert got == [(i, f"live{i}") for i in range(20)]


def test_timeout_bounds_the_wait_for_the_next_chunk() -> None:
    s = pgstreams.create_stream()
    pgstreams.write(s.id, "first")
    reader = pgstreams.read(s.id, timeout=0.3)
    assert next(reader).data == "first"
    started = time.monotonic()
    with pytest.raises(pgstreams.ReadTimeout) as caught:
        next(reader)
    assert isinstance(caught.value, TimeoutError)
    assert time.monotonic() - started >= 0.29


def test_bad_arguments_and_unknown_streams() -> None:
    with pytest.raises(pgstreams.StreamNotFound):
        list(pgstreams.read(uuid.uuid4(), timeout=5))
    with pytest.raises(pgstreams.StreamNotFound, match="not a stream id"):
        pgstreams.read("not-a-uuid")
    s = pgstreams.create_stream()
    with pytest.raises(ValueError, match="between 0 and"):
        pgstreams.read(s.id, from_offset=-1)
    with pytest.raises(TypeError):
        pgstreams.read(s.id, from_offset="3")
    with pytest.raises(ValueError, match="timeout"):
        pgstreams.read(s.id, timeout=0)


async def test_read_refuses_to_block_an_event_loop() -> None:
    with pytest.raises(pgstreams.StreamError, match="aread"):
        pgstreams.read(uuid.uuid4())


def test_a_stream_deleted_while_read_raises_not_found() -> None:
    s = pgstreams.create_stream()
    pgstreams.write(s.id, "a")
    reader = pgstreams.read(s.id, timeout=10)
    assert next(reader).data == "a"
    Stream.objects.filter(pk=s.pk).delete()
    listener.get_listener().announce([Mark(s.id, 2, False)])
    with pytest.raises(pgstreams.StreamNotFound, match="deleted"):
        next(reader)


async def test_200_async_readers_on_one_loop_share_two_connections_and_the_fetches() -> None:
    streams = [await pgstreams.acreate_stream() for _ in range(4)]
    n_chunks = 60

    async def reader(stream: Stream) -> list[tuple[int, str]]:
        return pairs([c async for c in pgstreams.aread(stream.id, timeout=20)])

    before = listener.get_listener().stats.fetches
    tasks = [asyncio.create_task(reader(streams[i % 4])) for i in range(200)]
    await asyncio.sleep(0.2)  # all 200 are waiting
    # sync_to_async: on the thread whose connections the session closes (to_thread's was left open).
    backends = await sync_to_async(pgstreams_backends)()
    for i in range(n_chunks):
        for s in streams:
            await pgstreams.awrite(s.id, f"{s.id.hex[:4]}-{i}")
    for s in streams:
        await pgstreams.aclose(s.id)
    results = await asyncio.wait_for(asyncio.gather(*tasks), 60)

    for i, result in enumerate(results):
        s = streams[i % 4]
        assert result == [(k, f"{s.id.hex[:4]}-{k}") for k in range(n_chunks)]
    # One LISTEN connection and one fetch connection serve all 200 readers.
    assert backends.get("listener") == 1 and backends.get("fetcher") == 1
    # Readers of a stream share each fetch: fetches follow the writes (at most a couple per
    # commit), not the 50 readers of each stream (which would be 50 x more).
    fetches = listener.get_listener().stats.fetches - before
    assert fetches <= 2 * 4 * (n_chunks + 1)


def test_connection_count_does_not_grow_with_readers() -> None:
    s = pgstreams.create_stream()
    readers = [pgstreams.read(s.id, timeout=20) for _ in range(200)]
    threads = [threading.Thread(target=lambda r=r: list(r)) for r in readers]
    for t in threads:
        t.start()
    time.sleep(0.3)
    backends = pgstreams_backends()
    pgstreams.close(s.id)
    for t in threads:
        t.join(20)
    assert backends.get("listener") == 1 and backends.get("fetcher") == 1
    # Besides, one flusher and one appender at most, once this process has written or appended.
    assert set(backends) <= {"listener", "fetcher", "flusher", "appender"} and max(backends.values()) == 1


@pytest.mark.usefixtures("fresh_listener")
def test_with_notifications_off_the_poll_delivers_with_one_query_per_interval() -> None:
    with override_settings(PGSTREAMS={"NOTIFY_MODE": "off", "POLL_INTERVAL": 0.2}):
        streams = [pgstreams.create_stream() for _ in range(30)]
        readers = [pgstreams.read(s.id, timeout=10) for s in streams]
        got: list[list[str]] = [[] for _ in streams]
        threads = [
            threading.Thread(target=lambda r=r, g=g: g.extend(c.data for c in r))
            for r, g in zip(readers, got, strict=True)
        ]
        for t in threads:
            t.start()
        time.sleep(0.5)  # let the first pages arrive
        hub = listener.get_listener()
        before = hub.stats.snapshot()
        time.sleep(2.0)  # idle: only the poll queries
        idle = hub.stats - before
        for s in streams:
            pgstreams.write(s.id, "polled")
            pgstreams.close(s.id)
        for t in threads:
            t.join(10)
    assert got == [["polled"]] * len(streams)
    # 2 s at 0.2 s +/- 20%: about 10 polls, each one query for all 30 streams (a poll counted
    # just before the window may fetch just inside it, hence the 1).
    assert 7 <= idle.polls <= 13
    assert abs(idle.fetches - idle.polls) <= 1
    assert hub.stats.poll_found >= 1


@pytest.mark.usefixtures("fresh_listener")
def test_readers_in_the_writing_process_are_woken_at_commit_not_by_the_flush() -> None:
    from pgstreams import notify

    notify.stop_flusher()
    # No flush after the first, no poll: only the wake-up at commit can deliver chunks 1 to 4.
    with override_settings(PGSTREAMS={"FLUSH_INTERVAL": 3600, "POLL_INTERVAL": 3600}):
        s = pgstreams.create_stream()
        reader = pgstreams.read(s.id, timeout=5)
        pgstreams.write(s.id, "c0")
        assert next(reader).data == "c0"
        for i in range(1, 5):
            pgstreams.write(s.id, f"c{i}")
            assert next(reader).data == f"c{i}"
        hub = listener.get_listener()
        assert hub.stats.polls == 0
        assert notify.flusher().depth() == 1  # c1 to c4 still wait to be flushed
    notify.stop_flusher()


async def test_a_reader_cancelled_while_its_page_is_fetched_breaks_nothing() -> None:
    streams = [await pgstreams.acreate_stream() for _ in range(20)]
    for s in streams:
        await pgstreams.awrite(s.id, "x")
    hub = listener.get_listener()
    # Readers whose first page is still being fetched when they are cancelled.
    tasks = [asyncio.create_task(anext(pgstreams.aread(s.id))) for s in streams]
    await asyncio.sleep(0)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    # The listener still serves everyone.
    for s in streams:
        await pgstreams.aclose(s.id)
        assert [c.data async for c in pgstreams.aread(s.id, timeout=5)] == ["x"]
    assert hub.stats.restarts == 0


async def test_an_offset_beyond_bigint_is_refused_before_it_reaches_the_listener() -> None:
    s = await pgstreams.acreate_stream()
    with pytest.raises(ValueError, match="bigint"):
        pgstreams.read(s.id, from_offset=2**63)
    with pytest.raises(ValueError, match="bigint"):
        await anext(pgstreams.aread(s.id, from_offset=2**63))
    await pgstreams.aclose(s.id)
    assert [c async for c in pgstreams.aread(s.id, from_offset=2**63 - 1, timeout=5)] == []


def _follow_while_writing(healthy, poisoned_read) -> tuple[list[str], BaseException | None]:
    """Read ``healthy`` in a thread while chunks are written to it and ``poisoned_read`` runs
    here; return what the healthy reader got and what the poisoned read raised."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.extend(c.data for c in pgstreams.read(healthy.id, timeout=10)))
    reader.start()
    pgstreams.write(healthy.id, "before")
    try:
        poisoned_read()
    except BaseException as exc:  # noqa: BLE001 - returned to the test, which checks it
        raised = exc
    else:
        raised = None
    for i in range(20):
        pgstreams.write(healthy.id, f"after{i}")
    pgstreams.close(healthy.id)
    reader.join(15)
    return got, raised


def test_a_request_the_server_rejects_fails_only_the_reader_that_made_it() -> None:
    # Below the API's check, a page the server refuses ("bigint out of range") must not stop
    # the listener from serving every other reader of the process.
    bad, healthy = pgstreams.create_stream(), pgstreams.create_stream()
    hub = listener.get_listener()
    tail = hub.attach(bad.id)

    def poisoned_read() -> None:
        try:
            hub.step(tail, 2**63, None).take(lambda: 10)
        finally:
            hub.detach(tail)

    got, raised = _follow_while_writing(healthy, poisoned_read)
    assert isinstance(raised, pgstreams.StreamError) and "out of range" in str(raised)
    assert got == ["before"] + [f"after{i}" for i in range(20)]
    assert hub.stats.restarts == 0


def test_a_chunk_the_client_cannot_load_fails_its_readers_and_no_one_else() -> None:
    # A row written around pgstreams with a time Python cannot hold: fetching it fails in the
    # client, for the one stream that has it.
    poisoned, healthy = pgstreams.create_stream(), pgstreams.create_stream()
    pgstreams.write(poisoned.id, "fine")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pgstreams_stream SET next_offset = 2 WHERE id = %s", [poisoned.id])
        cursor.execute(
            'INSERT INTO pgstreams_chunk (stream_id, "offset", data, created_at) VALUES (%s, 1, %s, %s)',
            [poisoned.id, "poison", "infinity"],
        )
    got, raised = _follow_while_writing(healthy, lambda: list(pgstreams.read(poisoned.id, timeout=10)))
    assert isinstance(raised, pgstreams.StreamError) and not isinstance(raised, pgstreams.ReadTimeout)
    assert f"reading stream {poisoned.id}" in str(raised)
    assert got == ["before"] + [f"after{i}" for i in range(20)]
    # Once the bad row is gone, the stream reads again.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pgstreams_chunk SET created_at = now() WHERE stream_id = %s", [poisoned.id])
    pgstreams.close(poisoned.id)
    assert [c.data for c in pgstreams.read(poisoned.id, timeout=10)] == ["fine", "poison"]


def test_a_reader_whose_chunks_were_pruned_gets_chunks_pruned_never_later_offsets() -> None:
    s = pgstreams.create_stream()
    pgstreams.write_many(s.id, [f"c{i}" for i in range(30)])
    pgstreams.close(s.id)
    delete_chunks(s.id, 0, 10)
    for start in (0, 5, 9):
        with pytest.raises(pgstreams.ChunksPruned) as caught:
            list(pgstreams.read(s.id, from_offset=start, timeout=5))
        assert (caught.value.offset, caught.value.first_offset) == (start, 10)
        assert "resume at offset 10" in str(caught.value)
    # Readers that start at or after the first chunk held get exactly their offsets.
    assert pairs(pgstreams.read(s.id, from_offset=12, timeout=5)) == [(i, f"c{i}") for i in range(12, 30)]


def test_a_gap_inside_a_stream_stops_the_reader_at_the_gap() -> None:
    s = pgstreams.create_stream()
    pgstreams.write_many(s.id, [f"c{i}" for i in range(20)])
    pgstreams.close(s.id)
    delete_chunks(s.id, 5, 10)
    got = []
    with pytest.raises(pgstreams.ChunksPruned) as caught:
        for chunk in pgstreams.read(s.id, timeout=5):
            got.append((chunk.offset, chunk.data))
    assert got == [(i, f"c{i}") for i in range(5)]
    assert (caught.value.offset, caught.value.first_offset) == (5, 10)


def test_chunks_pruned_ahead_of_a_waiting_reader_raise_chunks_pruned() -> None:
    from django.db import transaction

    s = pgstreams.create_stream()
    pgstreams.write_many(s.id, [f"c{i}" for i in range(5)])
    reader = pgstreams.read(s.id, timeout=5)
    assert [next(reader).offset for _ in range(5)] == list(range(5))
    with transaction.atomic():  # written and gone before any reader could fetch them
        pgstreams.write_many(s.id, [f"c{i}" for i in range(5, 10)])
        delete_chunks(s.id, 5, 10)
    pgstreams.write(s.id, "c10")
    with pytest.raises(pgstreams.ChunksPruned) as caught:
        next(reader)
    assert (caught.value.offset, caught.value.first_offset) == (5, 10)
    pgstreams.close(s.id)
    assert pairs(pgstreams.read(s.id, from_offset=10, timeout=5)) == [(10, "c10")]


@pytest.mark.usefixtures("fresh_listener")
def test_more_pages_than_one_query_takes_are_fetched_in_rounds_that_follow_at_once(monkeypatch) -> None:
    monkeypatch.setattr(fetch, "FETCH_KEYS", 3)
    streams = [pgstreams.create_stream() for _ in range(20)]
    for s in streams:
        pgstreams.write_many(s.id, [str(i) for i in range(5)])
        pgstreams.close(s.id)
    got: dict = {}
    threads = [
        threading.Thread(target=lambda s=s: got.__setitem__(s.id, [c.data for c in pgstreams.read(s.id, timeout=10)]))
        for s in streams
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert got == {s.id: [str(i) for i in range(5)] for s in streams}
    assert listener.get_listener().stats.fetches >= 7  # 20 first pages, 3 at a time


def test_timeout_counts_only_the_wait_for_chunks_not_the_callers_time() -> None:
    s = pgstreams.create_stream()
    pgstreams.write_many(s.id, ["a", "b"])
    pgstreams.close(s.id)
    got = []
    for chunk in pgstreams.read(s.id, timeout=0.2):
        got.append(chunk.data)
        time.sleep(0.3)  # slower than the timeout, while the next chunk and the end are there
    assert got == ["a", "b"]


async def test_timeout_counts_only_the_wait_for_chunks_in_aread_too() -> None:
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite_many(s.id, ["a", "b"])
    await pgstreams.aclose(s.id)
    got = []
    async for chunk in pgstreams.aread(s.id, timeout=0.2):
        got.append(chunk.data)
        await asyncio.sleep(0.3)
    assert got == ["a", "b"]


@pytest.mark.usefixtures("fresh_listener")
def test_the_listener_takes_only_well_formed_entries_of_the_streams_it_follows() -> None:
    s, other = pgstreams.create_stream(), pgstreams.create_stream()
    hub = listener.get_listener()
    tail = hub.attach(s.id)
    try:
        hub.hear(f"{s.id.hex}x:7,{s.id.hex.upper()}:8,{other.id.hex}:9,nonsense")
        assert tail.hint == 0  # its id followed by more, or in capitals, is not its entry
        hub.hear(f"{other.id.hex}:9,{s.id.hex}:7:c")
        assert (tail.hint, tail.close_hinted) == (7, True)
    finally:
        hub.detach(tail)


async def test_afollow_with_an_idle_interval_yields_empty_batches_and_stays_attached() -> None:
    """What an SSE response does between keepalives: it keeps its place in the listener (one
    tail, not a new one and a new fetch every interval)."""
    from pgstreams.reader import afollow

    s = await pgstreams.acreate_stream()
    follow = afollow(s.id, idle=0.2)
    assert (await anext(follow)).chunks == []
    tail = listener.get_listener()._tails[s.id]
    assert (await anext(follow)).chunks == []
    assert listener.get_listener()._tails[s.id] is tail  # never detached
    await pgstreams.awrite(s.id, "after two idle intervals")
    got = await anext(follow)
    while not got.chunks:  # a third idle interval may end first
        got = await anext(follow)
    assert [c.data for c in got.chunks] == ["after two idle intervals"] and got.caught_up
    await follow.aclose()
    with pytest.raises(ValueError, match="not both"):
        await anext(afollow(s.id, idle=1, timeout=1))


def test_the_fetch_reads_chunks_by_index_even_after_the_table_was_analyzed_with_few_streams() -> None:
    """The chunk table analyzed while it held a few streams' chunks (a fresh deploy, a prune that
    left little), then grown by many streams: the listener's fetch still reads each stream's
    chunks through the primary key. Planned with the stale statistics (two streams, so half the
    table per stream), it scanned the whole table once per stream in every fetch: 180 to 310 ms
    a fetch of 256 streams over 16,000 chunks, and readers waited seconds."""
    few = [pgstreams.create_stream() for _ in range(2)]
    for s in few:
        pgstreams.write_many(s.id, [f"c{i}" for i in range(10)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgstreams_chunk")
    many = Stream.objects.bulk_create(Stream(label="many") for _ in range(300))
    with connection.cursor() as cursor:
        cursor.execute(
            'INSERT INTO pgstreams_chunk (stream_id, "offset", data, created_at)'
            " SELECT s.id, o, 'x', now() FROM unnest(%s::uuid[]) AS s(id), generate_series(0, 59) AS o",
            [[s.id for s in many]],
        )
        query = fetch.FETCH_SQL.replace("%b", "%s")
        cursor.execute("EXPLAIN " + query, [[s.id for s in many[:256]], [0] * 256, fetch.PAGE_SIZE, fetch.PAGE_BYTES])
        plan = "\n".join(row[0] for row in cursor.fetchall())
        # Chunks partitioned by day (PGSTREAMS_TEST_PARTITIONED): days without a row are scanned.
        for table in set(re.findall(r"Seq Scan on (pgstreams_chunk\w*)", plan)):
            cursor.execute(f"SELECT EXISTS (SELECT FROM {table})")  # a name of the plan's
            assert not cursor.fetchone()[0], plan
    assert re.search(r"Index Scan (using|on) pgstreams_chunk\w*_pkey", plan), plan  # or a bitmap of it


@pytest.mark.usefixtures("fresh_listener")
@pytest.mark.parametrize("entry", ["{hex}:999999999999", "{hex}:1:c"])
def test_a_notification_for_an_offset_the_stream_has_not_reached_costs_one_fetch(entry: str) -> None:
    """Any role that may connect may NOTIFY on the channel. An entry announcing an offset (or an
    end) the stream has not reached made the listener fetch the stream again and again, ten
    times a second, for as long as a reader waited on it. No poll here: a poll counted before
    the snapshot and fetched after it made this test fail on a busy machine."""
    with override_settings(PGSTREAMS={"POLL_INTERVAL": 3600}):
        s = pgstreams.create_stream()
        pgstreams.write(s.id, "a")
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.extend(c.data for c in pgstreams.read(s.id, timeout=10)))
        reader.start()
        hub = listener.get_listener()
        deadline = time.monotonic() + 10
        channel = notify.channel_for(s.id)
        # Bounded: the reader waits at the tail, and the forged entry's channel is listened to.
        while not (got == ["a"] and hub.listening.is_set() and channel in hub._listened):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        before = hub.stats.snapshot()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [channel, entry.format(hex=s.id.hex)])
        time.sleep(2.0)
        counted = hub.stats - before
        pgstreams.write(s.id, "b")
        pgstreams.close(s.id)
        reader.join(10)
    assert got == ["a", "b"]  # the reader was not misled, and still hears what comes
    assert counted.notifications >= 1  # the forged entry was heard
    print(f"{entry}: {counted.fetches} fetches in 2 s")
    # The forged entry's one fetch, and the tail's first, which may still be under way at the snapshot.
    assert counted.fetches <= 2
