"""A soak reader process: ``read`` in threads and ``aread`` in asyncio tasks, one session after
another, each on a stream and from an offset drawn at random (the start, anywhere, the tail).

``python -m bench.soak.worker readers SLOT INCARNATION RUN_DIR SEED``. Every session is recorded: where
it started, the chunks it got (in batches, as they came), and how it ended: ``end`` (the stream
closed and every chunk read), ``pruned`` or ``gone`` (the coordinator pruned the stream),
``stopped`` (the reader chose to stop early) or ``error`` (anything else: an anomaly). Its
connections go where ``PGSTREAMS`` says: through the freezing proxy, or to a hot standby. Once
the run settles it starts no new session and leaves when the ones it has end.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

from django.db import Error, connections

import pgstreams

from .record import Known, Log, Streams, Worker, describe

READ_THREADS = 5
AREAD_TASKS = 5
FLUSH_EVERY = 0.2  # seconds between two records of a session's chunks
STOP_EARLY = 0.25  # the share of sessions that stop after a random number of chunks


class Session:
    """One reader's session on one stream: collects its chunks and records them in batches."""

    def __init__(self, log: Log, reader: str, n: int, stream: Known, start: int, limit: int | None) -> None:
        self.log, self.reader, self.n, self.stream, self.start, self.limit = log, reader, n, stream, start, limit
        self.pending: list[tuple[int, str]] = []
        self.count = 0
        self.flushed_at = time.monotonic()
        log(e="start", r=reader, n=n, s=stream.path, frm=start)

    def took(self, offset: int, data: str) -> bool:
        """Note a chunk; whether the session should stop here (its limit is reached)."""
        self.pending.append((offset, data))
        self.count += 1
        if time.monotonic() - self.flushed_at >= FLUSH_EVERY:
            self.flush()
        return self.limit is not None and self.count >= self.limit

    def flush(self) -> None:
        if self.pending:
            self.log(e="chunks", r=self.reader, n=self.n, o=self.pending[0][0], d=[d for _, d in self.pending])
            offsets = [o for o, _ in self.pending]
            if offsets != list(range(offsets[0], offsets[0] + len(offsets))):
                self.log(e="offsets", r=self.reader, n=self.n, got=offsets)  # not consecutive: checked
            self.pending = []
        self.flushed_at = time.monotonic()

    def connecting(self, url: str) -> str:
        """Note a connection's URL (whose host is one server), for whoever reads the record; ``url``."""
        self.log(e="connect", r=self.reader, n=self.n, url=url)
        return url

    def end(self, how: str, **details: Any) -> None:
        self.flush()
        self.log(e="end", r=self.reader, n=self.n, how=how, **details)


def ending(exc: BaseException) -> tuple[str, dict[str, Any]]:
    if isinstance(exc, pgstreams.ChunksPruned):
        return "pruned", {"first": exc.first_offset}
    if isinstance(exc, pgstreams.StreamNotFound):
        return "gone", {}
    return "error", {"why": describe(exc)}


class Readers:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.log = Log(worker.run_dir, worker.name)
        self.streams = Streams(worker.rng("streams"))
        self.refresh_lock = threading.Lock()

    def refresh(self) -> None:
        with self.refresh_lock:
            if self.streams.stale():
                try:
                    self.streams.refresh_sync()
                except Error:
                    connections.close_all()

    def session(self, reader: str, n: int, rng: Any) -> Session | None:
        stream = self.streams.pick_any()
        if stream is None:
            return None
        limit = rng.randint(1, 200) if rng.random() < STOP_EARLY else None
        return Session(self.log, reader, n, stream, self.streams.start_offset(stream), limit)

    def read_thread(self, k: int) -> None:
        reader, rng = f"{self.worker.name}/read{k}", self.worker.rng(f"read{k}")
        for n in range(10**9):
            if self.worker.settling():
                break
            self.refresh()
            session = self.session(reader, n, rng)
            if session is None:
                time.sleep(0.2)
                continue
            try:
                for chunk in pgstreams.read(session.stream.id, from_offset=session.start):
                    if session.took(chunk.offset, chunk.data):
                        session.end("stopped")
                        break
                else:
                    session.end("end")
            except Exception as exc:  # the record says what happened; the checker judges it
                how, details = ending(exc)
                session.end(how, **details)
        connections.close_all()

    async def aread_task(self, k: int) -> None:
        reader, rng = f"{self.worker.name}/aread{k}", self.worker.rng(f"aread{k}")
        for n in range(10**9):
            if self.worker.settling():
                break
            if self.streams.stale():
                await asyncio.to_thread(self.refresh)
            session = self.session(reader, n, rng)
            if session is None:
                await asyncio.sleep(0.2)
                continue
            try:
                stopped = False
                async with contextlib.aclosing(pgstreams.aread(session.stream.id, from_offset=session.start)) as it:
                    async for chunk in it:
                        if session.took(chunk.offset, chunk.data):
                            stopped = True
                            break
                session.end("stopped" if stopped else "end")
            except Exception as exc:
                how, details = ending(exc)
                session.end(how, **details)

    async def tasks(self) -> None:
        await asyncio.gather(*(self.aread_task(k) for k in range(AREAD_TASKS)))


def main(worker: Worker) -> None:
    readers = Readers(worker)
    threads = [
        threading.Thread(target=readers.read_thread, args=(k,), name=f"soak-read{k}") for k in range(READ_THREADS)
    ]
    threads.append(threading.Thread(target=asyncio.run, args=(readers.tasks(),), name="soak-aread"))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    readers.log(e="done")
