"""The LLM benchmark's worker processes (``pgstreams_bench --llm``; ``llm.py`` coordinates).

A token writer runs one asyncio task per stream of its share, each writing LLM-like tokens at a
fixed rate with one write method (``aappend``, ``stream_writer`` or ``awrite``), paced on
absolute deadlines so that a slow call does not lower the offered rate; it records each token's
write-call start, indexed by offset, and closes its streams when the writing window ends. With
``pace`` it keeps the same schedule and writes nothing: what the pacing alone costs, which every
method's CPU per token includes. A
token reader follows every stream with one ``aread`` task each until every stream is closed and
drained, or until the coordinator says the drain is over. Like ``procs.py``, each runs in a
spawned process set up by ``procs.setup``, reports raw timings and counts through a queue and
works out no figure itself. This module imports nothing of Django at import time.

Timestamps are ``time.monotonic()``, one clock shared by every process on the host.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import resource
import string
import time
import uuid
from array import array
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from .procs import Arrivals, Boot, follow, setup

METHODS = ("aappend", "stream_writer", "awrite")
PACE = "pace"  # the schedule alone, nothing written (not a default method)
APPEND_METHODS = ("aappend", "stream_writer")  # the methods that go through the appender
PROGRESS_EVERY = 0.5  # seconds between two updates of a process's progress counter


class Tokens:
    """Random LLM-like tokens: 1 to 4 lowercase words joined by spaces, with a leading space.
    Drawn once into a pool the writers cycle through, so that making up text costs the writer
    processes nothing measurable (drawing each token took a quarter of their CPU)."""

    POOL = 8192

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(2000)]
        self.pool = [" " + " ".join(rng.choices(words, k=rng.randint(1, 4))) for _ in range(self.POOL)]
        self.i = rng.randrange(self.POOL)

    def next(self) -> str:
        self.i = (self.i + 1) % self.POOL
        return self.pool[self.i]


@dataclass
class TokenWriterResult:
    # per stream id: each token's write-call start, indexed by offset (one task per stream)
    starts: dict[str, array] = field(default_factory=dict)
    call_seconds: array = field(default_factory=lambda: array("d"))  # aappend, awrite: each call
    lag_seconds: array = field(default_factory=lambda: array("d"))  # each call's start after its deadline
    committed_in_window: int = 0  # tokens committed when the writing window closed ...
    window_seconds: float = 0.0  # ... counted this long after the start (a busy loop counts late)
    errors: int = 0
    cpu_seconds: float = 0.0  # the process's, all threads, from the start to the last commit
    gc_seconds: float = 0.0  # of which the garbage collector's (``GcClock``), on any thread
    appender: dict[str, Any] | None = None  # AppenderStats over the run, for the append methods
    flusher: dict[str, Any] | None = None  # FlusherStats over the run


class GcClock:
    """The garbage collector's time in this process while in the block (``gc.callbacks``, wall
    time per collection, which holds the GIL throughout): a collection runs on whichever thread
    allocates when a generation fills, so its time is inside every other CPU figure, the
    appender thread's too."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._began = 0.0

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self._observe)
        return self

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self._observe)

    def _observe(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._began


class _Writing:
    """One writer process's streams, their schedule and what they recorded."""

    def __init__(self, boot: Boot, method: str, rate: float, seed: int) -> None:
        self.alias, self.method, self.interval = boot.alias, method, 1.0 / rate
        self.tokens = Tokens(seed)
        self.result = TokenWriterResult()
        self.committed = 0  # aappend, awrite: calls returned
        self.start = self.end = 0.0

    def committed_now(self) -> int:
        if self.method in APPEND_METHODS:
            from pgstreams.appender import appender

            return appender(self.alias).stats.appended
        return self.committed

    async def ticks(self, phase: float) -> AsyncIterator[float]:
        """The start time of each token of one stream: its deadline, or now when it is late; none
        once the window is over (a late stream does not make up for it after the window)."""
        k = 0
        while True:
            deadline = self.start + phase + k * self.interval
            now = time.monotonic()
            if deadline >= self.end or now >= self.end:
                return
            if deadline > now:
                await asyncio.sleep(deadline - now)
                now = time.monotonic()
            self.result.lag_seconds.append(now - deadline)
            yield now
            k += 1

    async def stream(self, sid: str, phase: float) -> None:
        times = self.result.starts[sid] = array("d")
        try:
            if self.method == PACE:
                async for t0 in self.ticks(phase):
                    times.append(t0)
                    self.committed += 1
            elif self.method == "stream_writer":
                await self._send_all(sid, phase, times)
            else:
                await self._call_each(sid, phase, times)
        except Exception:
            self.result.errors += 1

    async def _send_all(self, sid: str, phase: float, times: array) -> None:
        import pgstreams

        async with pgstreams.stream_writer(sid, close=True, using=self.alias) as w:
            async for t0 in self.ticks(phase):
                times.append(t0)
                await w.send(self.tokens.next())

    async def _call_each(self, sid: str, phase: float, times: array) -> None:
        import pgstreams

        write = pgstreams.aappend if self.method == "aappend" else pgstreams.awrite
        stream_id = uuid.UUID(sid)  # as a caller holding stream.id passes it
        async for t0 in self.ticks(phase):
            try:
                offset = await write(stream_id, self.tokens.next(), using=self.alias)
            except Exception:
                self.result.errors += 1
                continue
            self.result.call_seconds.append(time.monotonic() - t0)
            self.committed += 1
            if offset == len(times):
                times.append(t0)
            else:  # an offset out of step: its start time is unknown
                self.result.errors += 1
        await pgstreams.aclose(sid, using=self.alias)


def token_writer(
    boot: Boot,
    method: str,
    streams: list[str],
    rate: float,
    duration: float,
    channels: tuple[Any, ...],
    slot: int,
) -> None:
    """Write ``rate`` tokens/s to each of ``streams`` for ``duration`` s, one task per stream."""
    setup(boot)
    go, ready, results, progress = channels
    result = asyncio.run(_write_all(boot, method, streams, rate, duration, (go, ready, progress), slot))
    results.put(("writer", result))


async def _write_all(
    boot: Boot, method: str, streams: list[str], rate: float, duration: float, channels: tuple[Any, ...], slot: int
) -> TokenWriterResult:
    from pgstreams import appender

    go, ready, progress = channels
    writing = _Writing(boot, method, rate, seed=slot)
    appended_before = appender.appender(boot.alias).stats.snapshot()
    ready.put(("writer", os.getpid()))
    await asyncio.to_thread(go.wait)
    with GcClock() as collecting:
        cpu = time.process_time()
        writing.start = time.monotonic()
        writing.end = writing.start + duration
        phases = random.Random(slot).random
        tasks = [asyncio.create_task(writing.stream(sid, phases() / rate)) for sid in streams]
        counting = asyncio.create_task(_count(writing.committed_now, progress, slot))
        await asyncio.sleep(max(0.0, writing.end - time.monotonic()))
        writing.result.committed_in_window = writing.committed_now()
        writing.result.window_seconds = time.monotonic() - writing.start
        await asyncio.gather(*tasks)
        writing.result.cpu_seconds = time.process_time() - cpu
    writing.result.gc_seconds = collecting.seconds
    counting.cancel()
    progress[slot] = writing.committed_now()
    return _finish(writing, boot.alias, appended_before)


def _finish(writing: _Writing, alias: str, appended_before: Any) -> TokenWriterResult:
    """The appender's and the flusher's counts, then both stopped (the final commit and flush)."""
    from pgstreams import appender, notify

    result = writing.result
    if writing.method in APPEND_METHODS:
        result.appender = (appender.appender(alias).stats - appended_before).as_dict()
    flusher = notify.current_flusher()
    result.flusher = flusher.stats.as_dict() if flusher is not None else None
    appender.stop_appenders()
    notify.stop_flusher()
    return result


async def _count(counted: Any, progress: Any, slot: int) -> None:
    """Keep ``progress[slot]`` at ``counted()`` (for the coordinator's progress line)."""
    while True:
        progress[slot] = counted()
        await asyncio.sleep(PROGRESS_EVERY)


@dataclass
class TokenReaderResult(Arrivals):
    pid: int = 0
    unfinished: int = 0  # streams still being read when the drain ended
    peak_rss: int = 0  # bytes
    listener: dict[str, Any] = field(default_factory=dict)  # ListenerStats over the run
    unfollowed_us: float = 0.0  # CPU time to hear one entry of a stream this process does not follow
    cpu_seconds: float = 0.0  # the process's, all threads, from its ready to the end of its reading
    errors: list[str] = field(default_factory=list)


def token_reader(boot: Boot, stream_ids: list[str], channels: tuple[Any, ...], slot: int) -> None:
    """One ``aread`` task per stream until every stream ends, or until ``stop`` is set."""
    setup(boot)
    ready, stop, results, progress = channels
    result = asyncio.run(_read_all(stream_ids, (ready, stop, progress), slot))
    results.put(("reader", result))


async def _read_all(stream_ids: list[str], channels: tuple[Any, ...], slot: int) -> TokenReaderResult:
    from pgstreams import listener

    ready, stop, progress = channels
    result = TokenReaderResult(pid=os.getpid())
    tasks = [asyncio.create_task(follow(result, i, sid)) for i, sid in enumerate(stream_ids)]
    hub = listener.get_listener()
    await _until_listening(hub)
    before = hub.stats.snapshot()
    ready.put(("reader", os.getpid()))
    cpu = time.process_time()
    await _wait_or_stop(tasks, stop, lambda: len(result.offset), progress, slot)
    result.cpu_seconds = time.process_time() - cpu
    result.unfinished = sum(not task.done() for task in tasks)
    for task in tasks:
        task.cancel()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    result.errors = [repr(e) for e in outcomes if isinstance(e, Exception)][:10]
    result.listener = (hub.stats - before).as_dict()
    result.unfollowed_us = _unfollowed_cost(hub)
    result.peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return result


def _unfollowed_cost(hub: Any, payloads: int = 200) -> float:
    """What the listener spends on a notification entry for a stream nobody here follows, in
    microseconds of CPU: full payloads of such entries, heard while every stream is followed."""
    from pgstreams import notify
    from pgstreams.types import Mark

    payload = notify.pack(Mark(uuid.uuid4(), 123456, False) for _ in range(190))[0]
    entries, before = hub.stats.entries, hub.stats.hear_seconds
    for _ in range(payloads):
        hub.hear(payload)
    return round(1e6 * (hub.stats.hear_seconds - before) / (hub.stats.entries - entries), 3)


async def _until_listening(hub: Any, timeout: float = 30.0) -> None:
    """Until the listener LISTENs, and a moment for every reader to ask for its first page."""
    started = time.monotonic()
    while not hub.listening.is_set() and time.monotonic() - started < timeout:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)


async def _wait_or_stop(tasks: list[asyncio.Task[None]], stop: Any, counted: Any, progress: Any, slot: int) -> None:
    """Until every task is done or ``stop`` is set, keeping ``progress[slot]`` at ``counted()``."""
    everything = asyncio.gather(*tasks, return_exceptions=True)
    while not everything.done() and not stop.is_set():
        progress[slot] = counted()
        await asyncio.wait([everything], timeout=PROGRESS_EVERY)
    progress[slot] = counted()
