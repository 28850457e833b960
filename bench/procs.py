"""The benchmark's worker processes: writers (threads writing their own streams), readers
(``aread`` tasks, ``fanout`` per stream), and the fan-out mode's clock writer. Each runs in a
spawned process that sets Django up as the coordinator describes it, then reports raw timings
back through a queue. Nothing of Django is imported here at import time.

Timestamps are ``time.monotonic()``, one clock shared by every process on the host (the clock
writer's chunks carry the wall clock, which the Node subscribers read).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from array import array
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Boot:
    """What a child needs to set Django up exactly as the coordinator runs it."""

    settings_module: str
    alias: str  # the database writers write to
    databases: dict[str, dict[str, Any]]  # every alias the PGSTREAMS settings name
    pgstreams: dict[str, Any]


def setup(boot: Boot) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = boot.settings_module
    from django.conf import settings

    # Before django.setup(): connections are configured from this on first use.
    settings.DATABASES.update(boot.databases)
    import django

    django.setup()
    from django.test import override_settings

    override_settings(PGSTREAMS=boot.pgstreams).enable()  # for the life of the process


@dataclass
class WriterResult:
    latencies: array = field(default_factory=lambda: array("d"))
    # per stream id: commit times, indexed by offset (each stream has one writing thread)
    commits: dict[str, array] = field(default_factory=dict)
    started: float = 0.0
    finished: float = 0.0
    errors: int = 0
    failed_flushes: int = 0  # of the notification buffer (buffered mode)


def writer(
    boot: Boot,
    streams_per_thread: list[list[str]],
    duration: float,
    interval: float,
    chunk_bytes: int,
    go: Any,
    ready: Any,
    results: Any,
    progress: Any,
    slot: int,
) -> None:
    """Threads writing their streams flat out (``interval`` 0) or one write per ``interval`` s."""
    setup(boot)
    from django.db import connections

    import pgstreams

    result = WriterResult()
    lock = threading.Lock()
    pad = "x" * chunk_bytes

    def run(index: int, streams: list[str]) -> None:
        commits = {sid: array("d") for sid in streams}
        latencies = array("d")
        errors = 0
        go.wait()
        start = time.monotonic()
        end = start + duration
        next_at = start + interval * index / max(len(streams_per_thread), 1)
        n = 0
        while True:
            now = time.monotonic()
            if now >= end:
                break
            if interval:
                if now < next_at:
                    time.sleep(next_at - now)
                next_at += interval
            sid = streams[n % len(streams)]
            data = (f"{n:012d}" + pad)[:chunk_bytes]
            t0 = time.monotonic()
            try:
                offset = pgstreams.write(sid, data, using=boot.alias)
            except Exception:
                errors += 1
                continue
            t1 = time.monotonic()
            latencies.append(t1 - t0)
            assert offset == len(commits[sid])
            commits[sid].append(t1)
            n += 1
            if n % 16 == 0:
                progress[slot] += 16  # unlocked: a progress line, not a measurement
        connections.close_all()
        with lock:
            result.latencies.extend(latencies)
            result.commits.update(commits)
            result.errors += errors
            result.started = start if not result.started else min(result.started, start)
            result.finished = max(result.finished, time.monotonic())

    threads = [
        threading.Thread(target=run, args=(i, s), name=f"bench-writer-{i}") for i, s in enumerate(streams_per_thread)
    ]
    for t in threads:
        t.start()
    ready.put(("writer", os.getpid()))
    for t in threads:
        t.join()
    for streams in streams_per_thread:
        for sid in streams:
            pgstreams.close(sid, using=boot.alias)
    from pgstreams import notify

    flusher = notify.current_flusher()
    notify.stop_flusher()  # the final flush, before reporting
    result.failed_flushes = flusher.stats.failed_flushes if flusher is not None else 0
    results.put(("writer", result))


@dataclass
class Arrivals:
    """When each chunk reached a reader: its stream (an index into the coordinator's list),
    offset and time, in arrival order. Duplicates and chunks out of order are counted, never
    recorded."""

    stream: array = field(default_factory=lambda: array("i"))
    offset: array = field(default_factory=lambda: array("q"))
    received: array = field(default_factory=lambda: array("d"))
    duplicates: int = 0
    out_of_order: int = 0

    def record(self, index: int, offset: int, expected: int, at: float) -> int:
        """Note chunk ``offset`` of stream ``index`` arriving ``at``, when ``expected`` was the
        next offset due; return the next offset due after it."""
        if offset < expected:
            self.duplicates += 1
            return expected
        if offset > expected:
            self.out_of_order += 1
        self.stream.append(index)
        self.offset.append(offset)
        self.received.append(at)
        return offset + 1


@dataclass
class ReaderResult(Arrivals):
    pid: int = 0
    backends: int = 0
    polls: int = 0
    fetches: int = 0
    behind: int = 0  # fetches that found READ_DATABASE behind what was announced
    reconnects: int = 0  # of the LISTEN connection
    notifications: int = 0  # payloads the listener heard
    entries: int = 0  # stream entries in them, followed here or not
    fetch_seconds: float = 0.0
    elapsed: float = 0.0
    error: str = ""


def reader(boot: Boot, stream_ids: list[str], fanout: int, timeout: float, ready: Any, results: Any) -> None:
    """``fanout`` aread() loops per stream, until every stream ends (or ``timeout`` passes)."""
    setup(boot)
    result = asyncio.run(_read_all(boot, stream_ids, fanout, timeout, ready))
    results.put(("reader", result))


async def follow(result: Arrivals, index: int, sid: str) -> None:
    """Read stream ``sid`` with aread() to its end, recording its arrivals under ``index``."""
    import pgstreams

    expected = 0
    async for chunk in pgstreams.aread(sid):
        expected = result.record(index, chunk.offset, expected, time.monotonic())


async def _read_all(boot: Boot, stream_ids: list[str], fanout: int, timeout: float, ready: Any) -> ReaderResult:
    from pgstreams import listener

    result = ReaderResult(pid=os.getpid())
    started = time.monotonic()
    tasks = [asyncio.create_task(follow(result, i, sid)) for i, sid in enumerate(stream_ids) for _ in range(fanout)]
    hub = listener.get_listener()
    while not hub.listening.is_set() and time.monotonic() - started < 30:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # every reader has asked for its first page
    before = hub.stats.snapshot()
    ready.put(("reader", os.getpid()))
    measured_from = time.monotonic()
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), timeout)
    except TimeoutError:
        result.error = f"readers still waiting after {timeout:.0f} s"
    result.elapsed = time.monotonic() - measured_from
    counted = hub.stats - before
    result.polls = counted.polls
    result.fetches = counted.fetches
    result.behind = counted.read_behind
    result.reconnects = counted.reconnects
    result.notifications = counted.notifications
    result.entries = counted.entries
    result.fetch_seconds = counted.fetch_seconds
    result.backends = await asyncio.to_thread(_own_backends, boot.alias)
    return result


def _own_backends(alias: str) -> int:
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s",
            [f"pgstreams % {os.getpid()}"],
        )
        count = cursor.fetchone()[0]
    connections.close_all()
    return count


def server(boot: Boot, port: int) -> None:
    """The project's ASGI application (ASGI_APPLICATION) served by daphne on a loopback port, with
    the listen backlog the benchmark gives daphne everywhere (its own, 50, drops a connect storm's
    SYNs, and their clients try again 1, 3, 7, 15 and 31 s later)."""
    setup(boot)
    from channels.routing import get_default_application
    from daphne.server import Server

    from demo_project.servers import daphne_endpoint

    Server(application=get_default_application(), endpoints=[daphne_endpoint("127.0.0.1", port)]).run()


@dataclass
class ClientResult(Arrivals):
    errors: list[str] = field(default_factory=list)


ACK_EVERY = 128  # chunks, as pgstreams.js's ackEvery
ACK_DELAY = 0.25  # seconds, as pgstreams.js's timer


class _Acks:
    """A WebSocket client's acks, sent as pgstreams.js sends them."""

    def __init__(self, ws: Any) -> None:
        self.ws, self.frame, self.unacked = ws, "", 0
        self.timer: asyncio.Task[None] | None = None

    async def read(self, frame: str, chunks: int) -> None:
        self.frame, self.unacked = frame, self.unacked + chunks
        if self.unacked >= ACK_EVERY:
            if self.timer is not None:
                self.timer.cancel()
            await self.send()
        elif self.timer is None:
            self.timer = asyncio.create_task(self.later())

    async def later(self) -> None:
        await asyncio.sleep(ACK_DELAY)
        await self.send()

    async def send(self) -> None:
        import json

        import websockets

        self.timer, self.unacked = None, 0
        try:
            await self.ws.send(json.dumps({"type": "ack", "frame": self.frame}))
        except websockets.ConnectionClosed:
            pass  # the server closed after its end frame, which is still to be read


def ws_clients(base: str, stream_ids: list[str], assigned: list[int], timeout: float, ready: Any, results: Any) -> None:
    """WebSocket clients (one per entry of ``assigned``, an index into ``stream_ids``) that ack
    what they receive as pgstreams.js does (every ACK_EVERY chunks, else ACK_DELAY after the first
    unacknowledged frame), until their stream ends."""
    result = asyncio.run(_ws_follow_all(base, stream_ids, assigned, timeout, ready))
    results.put(("ws", result))


async def _ws_follow_all(
    base: str, stream_ids: list[str], assigned: list[int], timeout: float, ready: Any
) -> ClientResult:
    import json

    import websockets

    result = ClientResult()
    origin = base.replace("ws://", "http://")
    opened = asyncio.Event()
    pending = len(assigned)

    async def follow_socket(index: int) -> None:
        nonlocal pending
        expected = 0
        url = f"{base}/ws/pgstreams/{stream_ids[index]}/?from=0"
        async with websockets.connect(url, origin=origin, open_timeout=30, max_queue=None) as ws:
            acks = _Acks(ws)
            pending -= 1
            if not pending:
                opened.set()
            async for raw in ws:
                now = time.monotonic()
                message = json.loads(raw)
                if message["type"] == "end":
                    if message["next_offset"] != expected:
                        result.errors.append(f"end at {message['next_offset']}, but received up to {expected}")
                    return
                if message["type"] != "chunks":
                    result.errors.append(str(message))
                    return
                for item in message["items"]:
                    expected = result.record(index, item["offset"], expected, now)
                await acks.read(message["frame"], len(message["items"]))
            result.errors.append(f"closed without an end frame (code {ws.close_code}) after offset {expected - 1}")

    tasks = [asyncio.create_task(follow_socket(i)) for i in assigned]
    try:
        await asyncio.wait_for(opened.wait(), 60)
    finally:
        ready.put(("ws", os.getpid()))
    done, running = await asyncio.wait(tasks, timeout=timeout)
    for task in running:
        task.cancel()
        result.errors.append("still reading when the benchmark ended")
    for task in done:
        if task.exception() is not None:
            result.errors.append(repr(task.exception()))
    return result


TICK = 0.001  # seconds: the clock writer's wakes, at most one per


@dataclass
class ClockWriterResult:
    chunks: dict[str, int]  # per stream id: chunks written
    cpu_seconds: float  # the process's, all threads (the appender's too), from the start to the last commit
    appender_cpu_seconds: float  # of which the appender's thread
    batches: int  # the appender committed


def clock_writer(
    boot: Boot, stream_ids: list[str], rate: float, seconds: float, ready: Any, go: Any, results: Any
) -> None:
    """The fan-out benchmark's writer: once set up it sets ``ready`` and waits for ``go``, then
    writes ``rate`` chunks/s to each stream through its own ``stream_writer``, each chunk its
    wall-clock time (a JSON number), for ``seconds``; then it closes the streams and reports the
    chunks per stream and its CPU time. The streams' chunks
    are due in turn, evenly spread (chunk n of stream i at n / rate + i / (streams * rate)), so
    one task sends them all, each as it falls due, and sleeps until the next one: a model's
    tokens arrive, and the process spends its CPU on pgstreams, not on a timer per token (a task
    per stream sleeping for each of its chunks cost 12 us a chunk, as much as the writing). Each
    chunk carries the time it was sent, at most TICK after it was due."""
    setup(boot)

    import pgstreams
    from pgstreams.appender import appender

    async def main() -> ClockWriterResult:
        ready.set()
        go.wait()
        cpu = time.process_time()
        start = time.monotonic()
        every = 1 / (len(stream_ids) * rate)  # seconds between two chunks due, of any streams
        due = int(seconds / every - 1e-9) + 1  # chunk k of all is due at start + k * every, within seconds
        writers = [pgstreams.stream_writer(sid, close=True) for sid in stream_ids]
        try:
            sent, woke = 0, start
            while sent < due:  # wakes at most once per TICK
                if (pause := max(start + sent * every, woke + TICK) - time.monotonic()) > 0:
                    await asyncio.sleep(pause)
                woke = time.monotonic()
                for k in range(sent, min(int((woke - start) / every) + 1, due)):
                    await writers[k % len(writers)].send(repr(time.time()))
                    sent = k + 1
        finally:  # every writer's exit at once: their closes commit together
            await asyncio.gather(*(w.__aexit__(None, None, None) for w in writers))
        counts = [due // len(stream_ids) + (i < due % len(stream_ids)) for i in range(len(stream_ids))]
        stats = appender(boot.alias).stats
        return ClockWriterResult(
            dict(zip(stream_ids, counts, strict=True)), time.process_time() - cpu, stats.cpu_seconds, stats.batches
        )

    results.put(asyncio.run(main()))
