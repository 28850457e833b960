"""Cancellation on the write path, against a real Postgres: a stream writer's task cancelled at
every await point of its block's exit (as an ASGI server cancels a request's task when its client
goes away), or in its block, stores every chunk it sent, in order, closes the stream (with
``close=True``) only after them, and still ends cancelled."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.test import override_settings

import pgstreams
from pgstreams import appender, conf, db
from pgstreams.models import Chunk, Stream
from tests.helpers import appender_held

pytestmark = pytest.mark.django_db(transaction=True)

CHUNKS = 50


@pytest.fixture(autouse=True)
def _fresh_appenders():
    """Every test starts with no appender, and one stopped after it has committed what is queued."""
    appender.stop_appenders()
    yield
    appender.stop_appenders()


Point = tuple[tuple[str, str, int], ...]


def suspended_at(task: asyncio.Task[Any]) -> Point:
    """Where ``task`` waits: the code location of each coroutine it awaits through, outermost
    first (``Task.get_stack()`` gives the outermost only)."""
    places = []
    awaited: Any = task.get_coro()
    while awaited is not None and getattr(awaited, "cr_frame", None) is not None:
        frame = awaited.cr_frame
        places.append((frame.f_code.co_filename, frame.f_code.co_name, frame.f_lineno))
        awaited = awaited.cr_await
    return tuple(places)


async def write_then_cancel(
    sids: list[Any], k: int, at_first_points: Callable[[], None] = lambda: None
) -> list[tuple[bool, list[Point]]]:
    """Send CHUNKS chunks to each of ``sids`` through ``stream_writer(close=True)``, a task per
    stream, all at once, and cancel each task once, at the ``k``-th place its block's exit waits
    at (0 the first). ``at_first_points()`` runs once every exit has waited once (or returned),
    after the cancels if ``k`` is 0. Returns, per task, whether it ended cancelled, and the
    places its exit waited at."""
    ended: list[int] = []

    async def write(n: int) -> None:
        async with pgstreams.stream_writer(sids[n], close=True) as w:
            for i in range(CHUNKS):
                await w.send(f"c{i}")
            ended.append(n)  # the last statement of the block: its exit starts at once

    tasks = [asyncio.ensure_future(write(n)) for n in range(len(sids))]
    points: list[list[Point]] = [[] for _ in tasks]
    watched = set(range(len(tasks)))
    first_points_seen = False
    while watched:  # each loop turn, until every exit has returned or been cancelled
        for n in list(watched):
            task = tasks[n]
            if task.done():
                watched.discard(n)
            elif n in ended and (point := suspended_at(task)) and (not points[n] or point != points[n][-1]):
                points[n].append(point)
                if len(points[n]) == k + 1:
                    task.cancel()
                    watched.discard(n)
        if not first_points_seen and all(points[n] or tasks[n].done() or n not in watched for n in range(len(tasks))):
            first_points_seen = True
            at_first_points()
        await asyncio.sleep(0)
    if not first_points_seen:
        at_first_points()
    outcomes = []
    for n, task in enumerate(tasks):
        try:
            await task
        except asyncio.CancelledError:
            assert task.cancelled()
            outcomes.append((True, points[n]))
        else:
            outcomes.append((False, points[n]))
    return outcomes


def whole_then_closed(sid: Any) -> bool:
    """Whether every chunk sent is stored, in order, and the stream was closed after the last."""
    stream = Stream.objects.get(pk=sid)
    chunks = list(Chunk.objects.filter(stream_id=sid).order_by("offset").values_list("offset", "data", "created_at"))
    return (
        [(offset, data) for offset, data, _ in chunks] == [(i, f"c{i}") for i in range(CHUNKS)]
        and stream.next_offset == CHUNKS
        and stream.closed_at is not None
        and max(created for _, _, created in chunks) <= stream.closed_at
    )


WRITERS = 20


def state(sids: list[Any]) -> list[tuple[int, bool]]:
    """Each stream's chunks stored, and whether it is closed."""
    return [
        (Chunk.objects.filter(stream_id=sid).count(), Stream.objects.get(pk=sid).closed_at is not None) for sid in sids
    ]


@pytest.mark.parametrize("row", ["free", "held"])
def test_stream_writers_cancelled_at_each_await_of_their_exit_store_every_chunk_then_close(row: str) -> None:
    """For k = 0, 1, ...: WRITERS writers, each on its own stream, are cancelled each at the
    k-th place its exit waits, until every exit returns before its k-th. ``held``: another
    transaction holds the streams' rows until every exit has waited once (and 50 ms past the
    cancels, for k = 0), so the chunks wait for a later batch as the exits do. A task cancelled
    always ends cancelled; each stream always holds every chunk sent, in order, and is closed
    after them."""
    cancelled = 0
    kwargs = db.connect_kwargs(conf.database(), "test")
    for k in range(100):  # bounded: an exit has a few places to wait at
        sids = [pgstreams.create_stream().id for _ in range(WRITERS)]
        with psycopg.connect(**kwargs) as holder:
            if row == "held":
                holder.execute("SELECT 1 FROM pgstreams_stream WHERE id = ANY(%s) FOR UPDATE", [sids])
            if row == "held" and k == 0:
                outcomes = asyncio.run(held_cancel(sids, holder))
            else:
                outcomes = asyncio.run(write_then_cancel(sids, k, holder.rollback))
        appender.stop_appenders()  # commits what is still queued
        broken = [sid for sid in sids if not whole_then_closed(sid)]
        assert not broken, f"k={k}: {len(broken)} of {WRITERS} streams truncated: {state(broken)}"
        cancelled += sum(was for was, _ in outcomes)
        for was, points in outcomes:
            assert was or len(points) <= k, "the exit returned, so it was not cancelled: it waited fewer times"
        if not any(was for was, _ in outcomes):
            break
    print(f"{row}: {cancelled} exits cancelled, at each of their {k} places to wait")
    assert cancelled >= WRITERS


async def held_cancel(sids: list[Any], holder: psycopg.Connection[Any]) -> list[tuple[bool, list[Point]]]:
    """``write_then_cancel`` at the exits' first wait while the streams' rows are held, which
    stay held 50 ms more (the cancelled exits go on meanwhile)."""
    later: list[asyncio.Task[None]] = []

    async def release_later() -> None:
        await asyncio.sleep(0.05)
        holder.rollback()

    outcomes = await write_then_cancel(sids, 0, lambda: later.append(asyncio.ensure_future(release_later())))
    await later[0]
    return outcomes


def test_a_stream_writer_cancelled_in_its_block_ends_at_once_and_its_chunks_then_its_close_commit() -> None:
    """A token loop cancelled while it waits for its next token, with the chunk table held so
    that nothing it sent can commit yet: the task ends cancelled within a few loop turns (its
    exit waits for no commit), and once the table is free the stream holds every chunk sent, in
    order, then is closed."""
    sid = pgstreams.create_stream().id

    async def generate(gate: asyncio.Event) -> None:
        async with pgstreams.stream_writer(sid, close=True) as w:
            for i in range(CHUNKS):
                await w.send(f"c{i}")
            await gate.wait()  # the model's next token, which never comes

    async def main() -> bool:
        task = asyncio.ensure_future(generate(asyncio.Event()))
        with appender_held() as held:
            await held.waiting()  # the chunks wait at the table
            task.cancel()
            for _ in range(10):  # loop turns, not time: an exit that waited for a commit would not end
                await asyncio.sleep(0)
            ended = task.done()
        await asyncio.gather(task, return_exceptions=True)
        return ended and task.cancelled()

    assert asyncio.run(main())
    appender.stop_appenders()
    assert whole_then_closed(sid)


def test_a_failure_after_a_cancelled_exit_is_logged(caplog) -> None:
    """Nobody waits for what a cancelled writer sent: when its chunks fail (here its stream was
    closed before they came), the log says so, once it is known."""
    sid = pgstreams.create_stream().id

    pgstreams.close(sid)

    async def main() -> None:
        task = asyncio.ensure_future(write_and_close(sid))
        await asyncio.sleep(0)  # its body has run: its exit waits for results, which come later
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.to_thread(appender.stop_appenders)  # every result is known
        for _ in range(10):  # loop turns: the results reach the writer's loop
            await asyncio.sleep(0)

    with caplog.at_level(logging.WARNING, logger="pgstreams.appender"):
        asyncio.run(main())
    logged = [r.getMessage() for r in caplog.records]
    assert any("its cancelled writer sent failed" in m and "was closed" in m for m in logged), logged
    assert Chunk.objects.filter(stream_id=sid).count() == 0


async def write_and_close(sid: Any) -> None:
    async with pgstreams.stream_writer(sid, close=True) as w:
        for i in range(CHUNKS):
            await w.send(f"c{i}")


def test_a_writers_close_waits_for_chunks_left_in_an_appender_stopped_under_it() -> None:
    """The process's appenders are stopped as the block ends (their results not yet seen on the
    writer's loop): the close cannot go behind the chunks in that appender's queue, so it goes to
    the new one once they are settled, and the stream holds them all, then is closed."""
    sid = pgstreams.create_stream().id

    async def generate() -> int:
        async with pgstreams.stream_writer(sid, close=True) as w:
            for i in range(CHUNKS):
                await w.send(f"c{i}")
            appender.stop_appenders()  # commits them, blocking this loop: their results wait for it
        return w.sent

    assert asyncio.run(generate()) == CHUNKS
    appender.stop_appenders()
    assert whole_then_closed(sid)


def test_a_cancelled_writers_close_queued_behind_chunks_that_failed_on_a_held_row_fails_with_them(caplog) -> None:
    """Another transaction holds the stream's row: a writer's chunks wait for it, its block ends
    a second later (its close queued then, behind them), and its task is cancelled while its exit
    waits. The chunks fail after QUERY_TIMEOUT; the row is freed before the close's own
    QUERY_TIMEOUT has run out, but the close belongs to their chain and fails with them: the
    stream stays open rather than look cleanly finished without its chunks, and the log says
    why."""
    timeout = 3.0
    sid = pgstreams.create_stream().id
    holder = psycopg.connect(**db.connect_kwargs(conf.database(), "test"))
    holder.execute("BEGIN")
    holder.execute("SELECT 1 FROM pgstreams_stream WHERE id = %s FOR UPDATE", [sid])

    async def request() -> None:
        async with pgstreams.stream_writer(sid, close=True) as w:
            for i in range(5):
                await w.send(f"chunk {i}")
            await asyncio.sleep(1.5)  # the model's last tokens, then the block ends

    async def main() -> None:
        began = asyncio.get_running_loop().time()
        task = asyncio.ensure_future(request())
        await asyncio.sleep(1.8)  # the exit waits for the commits: the client goes away
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(began + timeout + 0.75 - asyncio.get_running_loop().time())
        holder.execute("ROLLBACK")  # after the chunks' deadline, before the close's
        await asyncio.sleep(2.0)

    try:
        with override_settings(PGSTREAMS={"QUERY_TIMEOUT": timeout}), caplog.at_level(logging.WARNING):
            asyncio.run(main())
    finally:
        holder.close()
    assert Stream.objects.get(pk=sid).closed_at is None
    assert Chunk.objects.filter(stream_id=sid).count() == 0
    logged = [r.getMessage() for r in caplog.records]
    assert any("its cancelled writer sent failed" in m and "held by another transaction" in m for m in logged), logged
