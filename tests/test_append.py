"""The append path against a real Postgres: group commit across streams, outside the caller's
transaction, with per-item errors, the stream writer, notifications once per batch, and how a
commit that got no answer is resolved."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid

import psycopg
import pytest
from django.db import connection, transaction
from django.test import override_settings

import pgstreams
from pgstreams import appender, appends, conf, db, listener, notify, resolution
from pgstreams import batch as batches
from pgstreams.durable import creates
from pgstreams.models import Chunk, Stream
from tests.helpers import ROOT, Rollback, appender_held, heard, listen_everywhere, subprocess_database_url

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fresh_appenders():
    """Every test starts with no appender, so one made here sees the test's settings."""
    appender.stop_appenders()
    yield
    appender.stop_appenders()


def stored(stream: Stream | uuid.UUID) -> list[tuple[int, str]]:
    return list(
        Chunk.objects.filter(stream_id=getattr(stream, "id", stream)).order_by("offset").values_list("offset", "data")
    )


def stats() -> appender.AppenderStats:
    return appender.appender(conf.database()).stats


def test_append_returns_the_committed_offset_in_call_order() -> None:
    s = pgstreams.create_stream()
    assert [pgstreams.append(s.id, f"t{i}") for i in range(5)] == [0, 1, 2, 3, 4]
    assert stored(s) == [(i, f"t{i}") for i in range(5)]
    s.refresh_from_db()
    assert s.next_offset == 5


def test_an_append_is_not_part_of_the_callers_transaction() -> None:
    s = pgstreams.create_stream()
    with pytest.raises(Rollback), transaction.atomic():
        pgstreams.write(s.id, "rolled back")
        # The appender finds the stream's row held by this transaction and keeps the append for
        # a later batch; so it runs in another thread, and commits once the transaction has
        # rolled back.
        result: list[int] = []
        thread = threading.Thread(target=lambda: result.append(pgstreams.append(s.id, "kept")))
        thread.start()
        thread.join(0.5)
        assert thread.is_alive()  # not in this transaction: it waits for it
        raise Rollback
    thread.join(10)
    assert result == [0] and stored(s) == [(0, "kept")]


def test_appends_from_threads_and_event_loops_commit_together_in_few_batches() -> None:
    streams = [pgstreams.create_stream().id for _ in range(20)]
    threads_done: dict[int, list[int]] = {}

    def thread_writes(t: int) -> None:  # thread t alone writes stream t, 25 chunks
        threads_done[t] = [pgstreams.append(streams[t], f"t{t}-{i}") for i in range(25)]

    async def loop_writes() -> list[int]:  # one event loop writes streams 10..19, 25 chunks each
        async def one(k: int) -> list[int]:
            return [await pgstreams.aappend(streams[k], f"t{k}-{i}") for i in range(25)]

        return [o for offsets in await asyncio.gather(*(one(k) for k in range(10, 20))) for o in offsets]

    before = stats().snapshot()
    with override_settings(PGSTREAMS={"APPEND_INTERVAL": 0.02}):
        threads = [threading.Thread(target=thread_writes, args=(t,)) for t in range(10)]
        for thread in threads:
            thread.start()
        async_offsets = asyncio.run(loop_writes())
        for thread in threads:
            thread.join(30)
    for k, sid in enumerate(streams):
        assert stored(sid) == [(i, f"t{k}-{i}") for i in range(25)]
    assert all(offsets == list(range(25)) for offsets in threads_done.values()) and len(threads_done) == 10
    assert sorted(async_offsets) == sorted(list(range(25)) * 10)
    done = stats() - before
    print(f"500 appends from 10 threads and 10 tasks: {done.batches} batches")
    assert done.appended == 500 and done.batches <= 500 / 5


@pytest.mark.parametrize("bound", ["count", "data"])
def test_a_batch_ends_at_append_batch_chunks_or_at_batch_bytes_of_data(monkeypatch, bound: str) -> None:
    """Six appends queued behind a held batch go in batches of two: by APPEND_BATCH, or by their
    data when BATCH_BYTES holds two of them."""
    monkeypatch.setattr(appender, "BATCH_BYTES", 250 if bound == "data" else appender.BATCH_BYTES)
    s = pgstreams.create_stream()

    async def queued() -> list[int | None]:
        with appender_held() as held:
            first = asyncio.ensure_future(pgstreams.aappend(s.id, "first"))
            await held.waiting()
            calls = asyncio.gather(*(pgstreams.aappend(s.id, f"{k}" * 100) for k in range(6)))
            await held.queued(6)
        return [await first, *await calls]

    before = stats().snapshot()
    with override_settings(PGSTREAMS={"APPEND_BATCH": 2 if bound == "count" else 10000}):
        assert asyncio.run(queued()) == list(range(7))
    assert (stats() - before).batches == 4
    assert stored(s) == [(0, "first")] + [(k + 1, f"{k}" * 100) for k in range(6)]


CUT_LONG_BATCHES = """
CREATE FUNCTION test_cut_long_batches() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT count(*) FROM added) > 2 THEN
        PERFORM pg_terminate_backend(pg_backend_pid());
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER test_cut_long_batches AFTER INSERT ON pgstreams_chunk REFERENCING NEW TABLE AS added
FOR EACH STATEMENT EXECUTE FUNCTION test_cut_long_batches();
"""


@pytest.mark.parametrize("caller", ["aappend", "stream_writer"])
def test_a_batch_the_connection_fails_under_every_time_commits_in_halves(caller: str) -> None:
    """The appender's backend ends itself whenever a statement inserts more than two chunks (a
    connection that fails before any long transaction can commit): eight chunks queued behind a
    held batch (eight appends, or one stream writer's eight chunks gathered in one item) still
    commit, two at a time, in order."""
    s = pgstreams.create_stream()
    with connection.cursor() as cursor:
        cursor.execute(CUT_LONG_BATCHES)
    try:

        async def queued() -> list[object]:
            with appender_held() as held:
                first = asyncio.ensure_future(pgstreams.aappend(s.id, "first"))
                await held.waiting()
                if caller == "aappend":
                    calls = asyncio.gather(*(pgstreams.aappend(s.id, f"{k}") for k in range(8)))
                    await held.queued(8)
                else:
                    w = pgstreams.stream_writer(s.id)
                    for k in range(8):
                        await w.send(f"{k}")
                    assert appender.appender(conf.database()).depth() == 1
                    calls = asyncio.gather(w.flush())
            return [await first, *await calls]

        before = stats().snapshot()
        results = asyncio.run(queued())
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER test_cut_long_batches ON pgstreams_chunk")
            cursor.execute("DROP FUNCTION test_cut_long_batches()")
    done = stats() - before
    print(f"{caller}: nine chunks, the backend ended under every batch of more than two: {done.retries} sent again")
    assert results == (list(range(9)) if caller == "aappend" else [0, None])
    assert stored(s) == [(0, "first")] + [(k + 1, f"{k}") for k in range(8)]


def test_a_closed_or_unknown_stream_fails_only_its_own_appends() -> None:
    good, closed = pgstreams.create_stream().id, pgstreams.create_stream().id
    pgstreams.close(closed)
    unknown = uuid.uuid4()

    async def together() -> list[object]:
        with appender_held() as held:  # "first" waits in its batch, the nine calls behind it
            first = asyncio.ensure_future(pgstreams.aappend(good, "first"))
            await held.waiting()
            calls = [pgstreams.aappend(sid, f"{n}") for n in range(3) for sid in (good, closed, unknown)]
            results = asyncio.gather(*calls, return_exceptions=True)
            await held.queued(9)
        assert await first == 0
        return await results

    before = stats().snapshot()
    results = asyncio.run(together())
    assert (stats() - before).batches == 2
    assert results[0::3] == [1, 2, 3]
    assert all(isinstance(r, pgstreams.StreamClosed) and "was closed" in str(r) for r in results[1::3])
    assert all(isinstance(r, pgstreams.StreamNotFound) and str(unknown) in str(r) for r in results[2::3])
    assert stored(good) == [(0, "first"), (1, "0"), (2, "1"), (3, "2")] and stored(closed) == []


def test_an_append_that_closes_its_stream_is_its_last_chunk_and_a_second_close_writes_nothing() -> None:
    s = pgstreams.create_stream()
    reader = pgstreams.read(s.id, timeout=5)

    async def last_words() -> list[object]:
        first = await pgstreams.aappend(s.id, "answer")
        ends = [pgstreams.aappend(s.id, "finished", close=True), pgstreams.aappend(s.id, "stopped", close=True)]
        return [first, *await asyncio.gather(*ends, return_exceptions=True)]

    first, finished, stopped = asyncio.run(last_words())
    assert (first, finished) == (0, 1)
    assert isinstance(stopped, pgstreams.StreamClosed)
    assert stored(s) == [(0, "answer"), (1, "finished")] and Stream.objects.get(pk=s.pk).is_closed
    assert [c.data for c in reader] == ["answer", "finished"]  # and the reader's loop ends at the close
    with pytest.raises(pgstreams.StreamClosed):
        pgstreams.append(s.id, "late", close=True)


def test_a_caller_who_awaits_each_append_waits_for_its_commits_not_for_the_interval() -> None:
    s = pgstreams.create_stream()

    async def one_by_one() -> list[int]:
        return [await pgstreams.aappend(s.id, f"{i}") for i in range(4)]

    with override_settings(PGSTREAMS={"APPEND_INTERVAL": 5.0}):  # a batch after the first waited 5 s
        started = time.monotonic()
        offsets = asyncio.run(one_by_one())
        took = time.monotonic() - started
    print(f"4 appends one by one, APPEND_INTERVAL 5 s: {took * 1000:.0f} ms")
    assert offsets == [0, 1, 2, 3] and took < 5.0


def test_bad_chunks_are_refused_before_they_are_queued() -> None:
    s = pgstreams.create_stream()
    with pytest.raises(pgstreams.ChunkTooLarge):
        pgstreams.append(s.id, "x" * (conf.max_chunk_bytes() + 1))
    with pytest.raises(pgstreams.InvalidChunk):
        pgstreams.append(s.id, "nul\x00")
    with pytest.raises(TypeError):
        pgstreams.append(s.id, b"bytes")  # type: ignore[arg-type]
    with pytest.raises(pgstreams.StreamNotFound):
        pgstreams.append("not-a-uuid", "x")
    assert stored(s) == [] and appender.appender(conf.database()).depth() == 0


def test_a_batch_the_database_refuses_is_split_until_the_refused_item_stands_alone() -> None:
    streams = [pgstreams.create_stream().id for _ in range(8)]
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE pgstreams_chunk ADD CONSTRAINT test_no_poison CHECK (data <> 'poison') NOT VALID")
    try:

        async def together() -> list[object]:
            calls = [pgstreams.aappend(sid, "poison" if k == 5 else f"ok{k}") for k, sid in enumerate(streams)]
            return await asyncio.gather(*calls, return_exceptions=True)

        before = stats().snapshot()
        with override_settings(PGSTREAMS={"APPEND_INTERVAL": 0.05}):
            pgstreams.append(streams[0], "first")
            results = asyncio.run(together())
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE pgstreams_chunk DROP CONSTRAINT test_no_poison")
    assert isinstance(results[5], pgstreams.StreamError) and "test_no_poison" in str(results[5])
    assert [r for k, r in enumerate(results) if k != 5] == [1, 0, 0, 0, 0, 0, 0]
    assert stored(streams[5]) == [] and stored(streams[7]) == [(0, "ok7")]
    print(f"a batch of 8 with one refused item: {(stats() - before).splits} splits")


def test_the_stream_writer_sends_in_order_and_its_exit_waits_for_every_commit() -> None:
    s = pgstreams.create_stream()

    async def generate() -> int:
        async with pgstreams.stream_writer(s.id, close=True) as w:
            for i in range(300):
                await w.send(f"w{i}")
        return w.sent

    assert asyncio.run(generate()) == 300
    assert stored(s) == [(i, f"w{i}") for i in range(300)]
    s.refresh_from_db()
    assert s.closed_at is not None


def test_a_stream_writer_with_its_limit_in_flight_waits_in_send_and_a_flush_beside_it_waits_too(monkeypatch) -> None:
    monkeypatch.setattr(appends, "WRITER_IN_FLIGHT", 5)
    s = pgstreams.create_stream()

    async def generate() -> bool:
        async with pgstreams.stream_writer(s.id) as w:
            with appender_held() as held:
                for i in range(5):
                    await w.send(f"w{i}")  # returns at once: nothing has committed yet
                await held.waiting()
                flushed = asyncio.ensure_future(w.flush())
                sixth = asyncio.ensure_future(w.send("w5"))
                await asyncio.sleep(0.2)
                waited = not sixth.done() and not flushed.done()
            await asyncio.wait_for(asyncio.gather(flushed, sixth), 10)  # two waiters, both woken
        return waited

    assert asyncio.run(generate())
    assert stored(s) == [(i, f"w{i}") for i in range(6)]


def test_a_stream_writers_chunks_sent_while_a_batch_commits_wait_as_one_item() -> None:
    """A hundred chunks sent while the writer's first batch is held: one item in the queue, not a
    hundred (one judgement and no object per chunk), committed whole in the next batch."""
    s = pgstreams.create_stream()

    async def generate() -> int:
        async with pgstreams.stream_writer(s.id) as w:
            with appender_held() as held:
                await w.send("w0")
                await held.waiting()
                for i in range(1, 101):
                    await w.send(f"w{i}")
                await held.queued(1)
                depth = appender.appender(conf.database()).depth()
        return depth

    before = stats().snapshot()
    assert asyncio.run(generate()) == 1
    done = stats() - before
    assert (done.batches, done.appended) == (2, 101)
    assert stored(s) == [(i, f"w{i}") for i in range(101)]


def test_writers_sending_while_the_appender_takes_their_chunks_lose_and_double_none() -> None:
    """Eight writers send 2,000 chunks each, yielding to the loop at random, while the appender
    takes their gathered chunks batch after batch: a chunk added as its item is taken either
    went with it or starts the next; every stream holds its chunks once, in order."""
    streams = [pgstreams.create_stream() for _ in range(8)]

    async def generate(s: Stream, seed: int) -> None:
        rng = random.Random(seed)
        async with pgstreams.stream_writer(s.id) as w:
            for i in range(2000):
                await w.send(f"{i}")
                if rng.random() < 0.25:
                    await asyncio.sleep(rng.choice((0, 0.001)))

    async def all_of_them() -> None:  # bounded: a chunk lost to its writer's count never settles
        await asyncio.wait_for(asyncio.gather(*(generate(s, k) for k, s in enumerate(streams))), 60)

    before = stats().snapshot()
    with override_settings(PGSTREAMS={"APPEND_INTERVAL": 0.002}):
        asyncio.run(all_of_them())
    done = stats() - before
    print(f"8 writers x 2,000 chunks: {done.batches} batches")
    assert done.appended == 16000
    for s in streams:
        assert stored(s) == [(i, f"{i}") for i in range(2000)]


def test_a_stream_closed_under_a_writers_gathered_chunks_fails_them_all() -> None:
    """The writer's stream is closed while its gathered chunks wait behind a held batch of
    another stream's: none of them is written, the writer raises StreamClosed, and so does its
    next send."""
    s, other = pgstreams.create_stream(), pgstreams.create_stream()

    async def generate() -> tuple[int, object, object]:
        w = pgstreams.stream_writer(s.id)
        await w.send("w0")
        await w.flush()
        with appender_held() as held:
            elsewhere = asyncio.ensure_future(pgstreams.aappend(other.id, "x"))
            await held.waiting()
            for i in range(1, 6):
                await w.send(f"w{i}")
            await held.queued(1)
            depth = appender.appender(conf.database()).depth()
            await pgstreams.aclose(s.id)
        flushed = await asyncio.gather(w.flush(), return_exceptions=True)
        later = await asyncio.gather(w.send("w6"), return_exceptions=True)
        assert await elsewhere == 0
        return depth, flushed[0], later[0]

    depth, flushed, later = asyncio.run(generate())
    assert depth == 1  # the five chunks, one item
    assert isinstance(flushed, pgstreams.StreamClosed) and isinstance(later, pgstreams.StreamClosed)
    assert stored(s) == [(0, "w0")] and stored(other) == [(0, "x")]


@pytest.mark.parametrize("refuser", ["content type", "database"])
def test_a_writers_gathered_chunks_commit_up_to_the_one_that_cannot_go_in(refuser: str) -> None:
    """Gathered behind a held batch, one item, a writer's chunks with a misfit among them (not
    JSON in a JSON stream: its judge; a CHECK constraint: the database, whose refusal the
    appender cuts in halves until the misfit stands alone): those before it commit, it and those
    after it fail, and the writer raises why."""
    content_type = "application/json" if refuser == "content type" else "text/plain"
    s = pgstreams.create_stream(content_type=content_type)
    chunks = ['"a"', '"b"', '"c"', "poison", '"d"', '"e"']
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE pgstreams_chunk ADD CONSTRAINT test_no_poison CHECK (data <> 'poison') NOT VALID")
    try:
        depths: list[int] = []  # kept here: the writer's exit raises

        async def generate() -> None:
            async with pgstreams.stream_writer(s.id) as w:
                with appender_held() as held:
                    await w.send('"w0"')
                    await held.waiting()
                    for data in chunks:
                        await w.send(data)
                    await held.queued(1)
                    depths.append(appender.appender(conf.database()).depth())

        before = stats().snapshot()
        with pytest.raises(pgstreams.StreamError) as raised:
            asyncio.run(generate())
        assert depths == [1]  # the six chunks, one item
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE pgstreams_chunk DROP CONSTRAINT test_no_poison")
    if refuser == "database":
        assert "test_no_poison" in str(raised.value) and (stats() - before).splits >= 2
    else:
        assert isinstance(raised.value, pgstreams.InvalidChunk) and "one JSON value" in str(raised.value)
    assert stored(s) == [(0, '"w0"'), (1, '"a"'), (2, '"b"'), (3, '"c"')]


def test_a_send_an_appender_refuses_leaves_no_item_behind_for_the_next_sends(monkeypatch) -> None:
    """A send that meets a stopped appender (one a stop took from under the writer) raises; the
    writer's next sends go to the process's new appender, every one of them committed, and its
    flush returns."""
    s = pgstreams.create_stream()
    stopped = appender.Appender(conf.database())
    stopped.stop()
    current = appender.appender

    async def generate() -> BaseException | None:
        async with pgstreams.stream_writer(s.id) as w:
            await w.send("a")
            monkeypatch.setattr(appends, "appender", lambda alias: stopped)
            refused = (await asyncio.gather(w.send("lost"), return_exceptions=True))[0]
            monkeypatch.setattr(appends, "appender", current)
            await w.send("b")
            await w.send("c")
        return refused

    refused = asyncio.run(asyncio.wait_for(generate(), 30))  # bounded: a lost chunk never settles
    assert isinstance(refused, pgstreams.StreamError) and "stopped" in str(refused)
    assert stored(s) == [(0, "a"), (1, "b"), (2, "c")]


def test_the_stream_writer_raises_when_its_stream_was_closed_under_it() -> None:
    s = pgstreams.create_stream()
    sent_after_close: list[int] = []

    async def generate() -> None:
        async with pgstreams.stream_writer(s.id) as w:
            for i in range(1000):
                if i == 10:
                    await w.flush()
                    await pgstreams.aclose(s.id)  # as a "stop" button would, from elsewhere
                    sent_after_close.append(w.sent)
                await w.send(f"w{i}")
                await asyncio.sleep(0.002)

    with pytest.raises(pgstreams.StreamClosed):
        asyncio.run(generate())
    assert stored(s) == [(i, f"w{i}") for i in range(10)]
    assert sent_after_close == [10]


@pytest.mark.usefixtures("fresh_listener")
def test_readers_in_the_appending_process_are_woken_at_commit_not_by_the_flush() -> None:
    notify.stop_flusher()
    # No flush after the first, no poll: only the wake-up at commit can deliver chunks 1 to 4.
    with override_settings(PGSTREAMS={"FLUSH_INTERVAL": 3600, "POLL_INTERVAL": 3600}):
        s = pgstreams.create_stream()
        reader = pgstreams.read(s.id, timeout=5)
        pgstreams.append(s.id, "c0")
        assert next(reader).data == "c0"
        for i in range(1, 5):
            pgstreams.append(s.id, f"c{i}")
            assert next(reader).data == f"c{i}"
        assert listener.get_listener().stats.polls == 0
        assert notify.flusher().depth() == 1  # c1 to c4 still wait to be flushed
        reader.close()
    notify.stop_flusher()


def test_notifications_go_out_once_per_batch() -> None:
    streams = [pgstreams.create_stream().id for _ in range(10)]
    with psycopg.connect(**db.connect_kwargs(conf.database(), "test")) as listen:
        # One channel: a batch's streams are announced in one notification (with shards, one per shard).
        with override_settings(PGSTREAMS={"NOTIFY_MODE": "per_write", "APPEND_INTERVAL": 0.02, "NOTIFY_SHARDS": 1}):
            listen_everywhere(listen)
            before = stats().snapshot()

            async def many() -> None:
                await asyncio.gather(*(pgstreams.aappend(sid, f"{i}") for i in range(20) for sid in streams))

            asyncio.run(many())
            batches = (stats() - before).batches
        notes = heard(listen, streams, until=lambda notes: len(notes) >= batches, linger=0.3)
    marks = [m for n in notes for m in n.marks]
    print(f"200 appends to 10 streams: {batches} batches, {len(notes)} notifications")
    assert len(notes) == batches < 200
    assert {m.stream_id: m.next_offset for m in marks} == dict.fromkeys(streams, 20)


def test_a_batch_announced_in_the_transaction_is_not_announced_again_after_it() -> None:
    """NOTIFY_MODE is read once per batch: the setting changing while a batch commits (here, as
    its caller gets the offset, which is before the batch is announced) must not send a
    per_write batch's notification a second time through the buffered flusher."""
    sid = pgstreams.create_stream().id
    per_write = override_settings(PGSTREAMS={"NOTIFY_MODE": "per_write"})
    per_write.enable()
    future: concurrent.futures.Future[int] = concurrent.futures.Future()
    future.add_done_callback(lambda _: per_write.disable())  # back to "buffered", the default
    try:
        with psycopg.connect(**db.connect_kwargs(conf.database(), "test")) as listen:
            listen_everywhere(listen)
            appender.appender(conf.database()).submit(batches.Append(sid, future, data="x"))
            assert future.result(timeout=10) == 0
            notes = heard(listen, [sid], until=lambda notes: len(notes) >= 1, linger=0.5)
    finally:
        if not future.done():
            per_write.disable()
        notify.stop_flusher()
    print(f"notifications of a per_write batch whose mode changed as it committed: {len(notes)}")
    assert [[(m.next_offset, m.closed) for m in n.marks] for n in notes] == [[(1, False)]]


def run_batch(conn: psycopg.Connection, *appends: tuple[uuid.UUID, str]) -> batches.Outcome:
    """A batch of ``appends`` (stream, data) judged and written on ``conn``, in its transaction."""
    items: list[batches.Item] = [batches.Append(sid, concurrent.futures.Future(), data=data) for sid, data in appends]
    return batches.run(conn, items, None, False)


def resolved(outcome: batches.Outcome) -> bool | None:
    """Whether the appender finds the batch of ``outcome`` committed, as after a lost answer."""
    target = appender.appender(conf.database())
    lost = RuntimeError("lost")
    return resolution.committed(target._connection, target._close, outcome.xid, outcome.pid, outcome.places, lost)


def test_a_commit_without_answer_is_resolved_by_asking_the_database() -> None:
    """The resolution itself, on real batches run by another connection: committed, rolled
    back, and one still in progress on a live backend, which is ended first."""
    s = pgstreams.create_stream()
    with psycopg.connect(**db.connect_kwargs(conf.database(), "test")) as other:
        for outcome in ("COMMIT", "ROLLBACK"):
            other.execute("BEGIN")
            batch = run_batch(other, (s.id, "x"))
            other.execute(outcome)
            assert resolved(batch) is (outcome == "COMMIT")
        other.execute("BEGIN")
        batch = run_batch(other, (s.id, "x"))
        assert resolved(batch) is False  # it ended the backend
        with pytest.raises(psycopg.OperationalError):
            other.execute("SELECT 1")
    assert stored(s) == [(0, "x")]


def test_an_append_its_streams_content_type_cannot_hold_fails_alone() -> None:
    """In one batch: a JSON stream's good and bad chunks, a stream of bytes, a text stream, and
    a stream writer whose second chunk is not JSON. Only the misfits fail (and the writer's
    chunks after its misfit, unsent); the rest commit in order."""
    from pgstreams import contents

    text = pgstreams.create_stream()
    data = pgstreams.create_stream(content_type="application/json")
    raw = Stream.objects.create(content_type="application/octet-stream")
    contents.kinds._known.pop(data.id)  # as in a process that did not make it

    async def batch() -> list:
        async def writer() -> BaseException | None:
            try:
                async with pgstreams.stream_writer(data.id) as w:
                    for chunk in ('"w0"', "w1", '"w2"'):
                        await w.send(chunk)
            except pgstreams.StreamError as exc:
                return exc
            return None

        calls = [pgstreams.aappend(data.id, "1"), pgstreams.aappend(data.id, "1 2"), pgstreams.aappend(raw.id, "x")]
        calls += [pgstreams.aappend(text.id, "t"), writer()]
        return await asyncio.gather(*calls, return_exceptions=True)

    first, two, to_raw, to_text, writer = asyncio.run(batch())
    assert isinstance(two, pgstreams.InvalidChunk) and "one JSON value" in str(two)
    assert isinstance(to_raw, pgstreams.InvalidChunk) and "holds bytes" in str(to_raw)
    assert isinstance(writer, pgstreams.InvalidChunk) and to_text == 0
    assert [d for _, d in stored(data)] == ["1", '"w0"'] and first == 0
    assert stored(text) == [(0, "t")] and not Chunk.objects.filter(stream=raw).exists()


def test_a_committed_batch_is_found_committed_after_its_first_stream_was_deleted() -> None:
    """A batch over two streams commits, its answer is lost, and the stream of its first row is
    deleted before the appender asks (as a prune, an expiry or a DELETE may do): the batch is
    still found committed, so it is not sent again and the other stream holds its chunk once.
    And when every stream of a batch is gone, the transaction's own status tells."""
    first, second = sorted((pgstreams.create_stream().id for _ in range(2)), key=lambda sid: sid.int)
    with psycopg.connect(**db.connect_kwargs(conf.database(), "test")) as other:
        other.execute("BEGIN")
        batch = run_batch(other, (second, "b"), (first, "a"))
        other.execute("COMMIT")
        assert batch.places == [(first, 0), (second, 0)]  # locked, and written, in id order
        Stream.objects.filter(pk=first).delete()
        assert resolved(batch) is True
        Stream.objects.filter(pk=second).delete()
        assert resolved(batch) is True
        third = pgstreams.create_stream().id
        other.execute("BEGIN")
        batch = run_batch(other, (third, "c"))
        other.execute("ROLLBACK")
        Stream.objects.filter(pk=third).delete()
        assert resolved(batch) is False


def test_a_batch_of_creates_only_is_resolved_by_its_transactions_status() -> None:
    """A batch that only makes streams (the Durable Streams endpoint's plain creates) writes no
    chunk, but has a transaction to ask about: committed, or rolled back, after a lost answer."""
    with psycopg.connect(**db.connect_kwargs(conf.database(), "test")) as other:
        for outcome in ("COMMIT", "ROLLBACK"):
            stream = creates._new(None, f"resolved/{outcome}", "text/plain", None, None)
            item = creates._Insert(stream.id, concurrent.futures.Future(), values=creates._values(stream, "default"))
            other.execute("BEGIN")
            batch = batches.run(other, [item], None, False)
            other.execute(outcome)
            assert batch.results == [True] and batch.xid is not None
            assert resolved(batch) is (outcome == "COMMIT")
    assert list(Stream.objects.filter(path__startswith="resolved/").values_list("path", flat=True)) == [
        "resolved/COMMIT"
    ]


def test_once_a_stream_writers_chunk_fails_its_later_chunks_fail_unsent() -> None:
    """A refused chunk in the middle of what a writer has in flight: the chunks sent after it
    are not committed after it, so the stream never has a hole behind a later chunk."""
    s = pgstreams.create_stream()
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE pgstreams_chunk ADD CONSTRAINT test_no_poison CHECK (data <> 'poison') NOT VALID")
    try:

        async def generate() -> None:
            async with pgstreams.stream_writer(s.id) as w:
                for data in ("a", "b", "poison", "c", "d", "e"):
                    await w.send(data)

        with override_settings(PGSTREAMS={"APPEND_INTERVAL": 0.05}), pytest.raises(pgstreams.StreamError) as raised:
            asyncio.run(generate())
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE pgstreams_chunk DROP CONSTRAINT test_no_poison")
    assert "test_no_poison" in str(raised.value)
    assert stored(s) == [(0, "a"), (1, "b")]


class _StopRacingAppender(appender.Appender):
    """An appender whose thread, the next time it finds its queue empty and asks whether it was
    stopped (once ``armed``), lets a submit() and a stop() from other threads go first, unless
    it asks holding the lock that keeps them out: the window between the two checks, widened."""

    def __init__(self, alias: str) -> None:
        self.armed = False
        self.asking = threading.Event()  # its thread asks whether it was stopped
        self.go_on = threading.Event()
        self.stop_asked = threading.Event()
        super().__init__(alias)

    @property  # type: ignore[override]
    def _stopped(self) -> bool:
        if self.armed and threading.current_thread() is self._thread:
            self.armed = False
            self.asking.set()
            if not self._lock.locked():  # nothing keeps submit() and stop() out: let them in
                self.go_on.wait(30)
        return self.__dict__["stopped"]

    @_stopped.setter
    def _stopped(self, value: bool) -> None:
        self.__dict__["stopped"] = value
        if value:
            self.stop_asked.set()


def test_an_append_submitted_as_the_appender_stops_is_committed_not_left_waiting() -> None:
    """submit() between the thread's look at its empty queue and its look at whether it was
    stopped, then stop(): the append is committed (or refused, saying the appender stopped),
    never left with a future nobody resolves."""
    s = pgstreams.create_stream()
    racing = _StopRacingAppender(conf.database())
    first: concurrent.futures.Future[int | None] = concurrent.futures.Future()
    racing.submit(batches.Append(s.id, first, data="a"))
    assert first.result(10) == 0
    racing.armed = True
    racing._wake.set()  # it looks at its (empty) queue again
    assert racing.asking.wait(10)
    second: concurrent.futures.Future[int | None] = concurrent.futures.Future()
    try:
        racing.submit(batches.Append(s.id, second, data="b"))
    except pgstreams.StreamError as exc:
        second.set_exception(exc)
    stopping = threading.Thread(target=racing.stop, name="test-appender-stop")
    stopping.start()
    assert racing.stop_asked.wait(10)
    racing.go_on.set()
    stopping.join(30)
    try:
        result: object = second.result(10)  # bounded: a future nobody resolves would wait forever
    except concurrent.futures.TimeoutError:
        result = "never resolved"
    except pgstreams.StreamError as exc:
        result = exc
    assert result == 1 or (isinstance(result, pgstreams.StreamError) and "stopped" in str(result)), result
    assert stored(s) == ([(0, "a"), (1, "b")] if result == 1 else [(0, "a")])


def _chunkless_batch(kind: str, sid: uuid.UUID) -> list[batches.Item]:
    """A batch that writes no chunk: a stream writer's close, a Durable Streams append of no
    body that records its producer's batch, or a plain create."""
    from pgstreams.durable import appends as durable_appends

    if kind == "close":
        return [appends._Close(sid, concurrent.futures.Future())]
    if kind == "producer":
        producer = pgstreams.Producer("p", 0, 0)
        return [durable_appends.DurableAppend(sid, concurrent.futures.Future(), producer=producer, path="x")]
    stream = creates._new(None, f"chunkless/{sid}", "text/plain", None, None)
    return [creates._Insert(stream.id, concurrent.futures.Future(), values=creates._values(stream, "default"))]


@pytest.mark.parametrize("kind", ["close", "producer", "create"])
def test_a_batch_that_wrote_no_chunk_is_judged_by_its_rows_not_by_a_reused_transaction_id(kind: str) -> None:
    """A batch that wrote no chunk was judged from pg_xact_status alone. After a failover to a
    standby that never saw its commit, the new primary gives its transaction id again, maybe to
    a transaction that commits. Here the batch rolls back and a committed transaction's id
    stands in for the reused one: the batch is found not committed, by what it would have left
    (the stream still open, the producer's state behind, no stream made); committed, it is found
    committed by the same rows."""
    sid = pgstreams.create_stream().id
    target = appender.appender(conf.database())
    lost = RuntimeError("lost")
    with psycopg.connect(**db.connect_kwargs(conf.database(), "test")) as other:
        for outcome in ("ROLLBACK", "COMMIT"):
            items = _chunkless_batch(kind, sid)
            other.execute("BEGIN")
            batch = batches.run(other, items, None, False)
            other.execute(outcome)
            assert batch.xid is not None and not batch.places and not isinstance(batch.results[0], BaseException)
            xid = batch.xid
            if outcome == "ROLLBACK":
                with other.transaction():  # another transaction, committed: as one given the same id
                    (xid,) = other.execute("SELECT pg_current_xact_id()::text").fetchone()
            traces = resolution.traces(items, batch)
            found = resolution.committed(target._connection, target._close, xid, batch.pid, [], lost, traces)
            assert found is (outcome == "COMMIT"), outcome


@pytest.mark.parametrize("kind", ["close", "producer", "create", "close, then a producer's close again"])
def test_a_committed_batch_that_wrote_no_chunk_is_found_committed_after_its_rows_were_written_again(
    kind: str,
) -> None:
    """The batch commits, then other transactions write its rows again (its stream's, its
    producer's), so no row names it as its writer any more: nothing it left says it did not
    commit (a producer's close of a stream the batch closed records no state, and is not taken
    for one behind), so its transaction's status tells: committed."""
    from pgstreams.durable import appends as durable_appends

    sid = pgstreams.create_stream().id
    if kind == "close, then a producer's close again":
        again = durable_appends.DurableAppend(
            sid, concurrent.futures.Future(), producer=pgstreams.Producer("p", 0, 0), path="x", closing=True
        )
        items: list[batches.Item] = [appends._Close(sid, concurrent.futures.Future()), again]
    else:
        items = _chunkless_batch(kind, sid)
    target = appender.appender(conf.database())
    with psycopg.connect(**db.connect_kwargs(conf.database(), "test")) as other:
        other.execute("BEGIN")
        batch = batches.run(other, items, None, False)
        other.execute("COMMIT")
        assert not any(isinstance(result, BaseException) for result in batch.results), batch.results
        with other.transaction():
            other.execute("UPDATE pgstreams_stream SET label = 'written again' WHERE id = %s", [sid])
            other.execute("UPDATE pgstreams_producer SET seq = seq WHERE stream_id = %s", [sid])
        traces = resolution.traces(items, batch)
        lost = RuntimeError("lost")
        assert resolution.committed(target._connection, target._close, batch.xid, batch.pid, [], lost, traces) is True


# A process whose appender sends batches of several MiB (64 threads appending chunks of 60 KB to
# one stream until it is closed), printing its pid first.
_FLOODER = """
import os, sys, threading
import django
from django.conf import settings
from bench.proxy import database_via, proxy_for

# Its connections cross a proxy of its own at 4 MB/s, which stops with it: what it has not yet
# sent is not waiting in the kernel's buffers (on TCP they take MiBs), so the server stays in the
# message.
proxy = proxy_for(settings.DATABASES["default"], rate=4e6).start()
settings.DATABASES["default"] = database_via(proxy, settings.DATABASES["default"])
django.setup()
import pgstreams

print(os.getpid(), flush=True)

def run(t):
    for i in range(100000):
        pgstreams.append(sys.argv[1], f"{t}:{i}:" + "x" * 60000)

threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(64)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
"""


@pytest.mark.multiprocess
def test_an_appender_stopped_while_it_sends_a_batch_holds_no_row_and_a_stop_goes_through_at_once() -> None:
    """A process (SIGSTOP) stopped while its appender sends a batch of MiBs: the server waits in
    ClientRead inside the message, where no idle bound runs. It holds no row meanwhile (the batch
    locks its rows in the statement that carries the data, once the server has all of it), so a
    stop of the stream commits at once instead of failing after QUERY_TIMEOUT; and the stopped
    batch, resumed, writes nothing after the stop."""
    sid = pgstreams.create_stream().id
    env = {**os.environ, "DATABASE_URL": subprocess_database_url(), "DJANGO_SETTINGS_MODULE": "demo_project.settings"}
    proc = subprocess.Popen(
        [sys.executable, "-c", _FLOODER, str(sid)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        name = f"pgstreams appender {int(proc.stdout.readline())}"
        landed = None
        deadline = time.monotonic() + 60
        while landed is None and time.monotonic() < deadline:  # bounded: until a stop lands inside a send
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND state = 'active'"
                    " AND wait_event = 'ClientRead'",
                    [name],
                )
                found = cursor.fetchone()
            if found is None:
                continue
            proc.send_signal(signal.SIGSTOP)
            time.sleep(0.2)
            with connection.cursor() as cursor:
                cursor.execute("SELECT state, wait_event FROM pg_stat_activity WHERE pid = %s", [found[0]])
                if cursor.fetchone() == ("active", "ClientRead"):
                    landed = found[0]
                else:
                    proc.send_signal(signal.SIGCONT)
        assert landed is not None, "the stop never landed inside a batch's send"
        began = time.monotonic()
        last = pgstreams.append(sid, "stopped", close=True)  # StreamError after QUERY_TIMEOUT if held
        assert time.monotonic() - began < db.idle_bound()
        proc.send_signal(signal.SIGCONT)
        time.sleep(1.0)  # the stopped batch goes on, and finds the stream closed
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait(10)
    chunks = stored(sid)
    assert [offset for offset, _ in chunks] == list(range(last + 1))
    assert chunks[-1] == (last, "stopped")
