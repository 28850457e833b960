"""A soak writer process: every Python way of writing, at once, to the soak's open streams.

``python -m bench.soak.worker writers SLOT INCARNATION RUN_DIR SEED``. Threads write with ``write`` and
``write_many`` inside transactions (some touching two streams, some rolled back on purpose), with
``write(producer=...)`` (every failed attempt retried with the same batch), and with ``append``;
asyncio tasks with ``aappend`` and ``stream_writer``. Each attempt is recorded before it is made
and its outcome after (``record``). Django's connections go straight to the database; the
appender's and flusher's go where ``PGSTREAMS['DATABASE']`` says (through the freezing proxy in
some processes). Stops once the run settles, after its attempts in flight end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from django.db import Error, connections, transaction

import pgstreams
from bench.tasks import answer, count
from pgstreams import aisdk, generations

from .record import (
    GAVE_UP,
    GENERATION_ATTEMPTS,
    GENERATION_CHUNKS,
    GENERATION_LABEL,
    GENERATION_LEASE,
    GENERATION_QUEUE,
    GENERATIONS_PREFIX,
    TOKEN_DELAY,
    Log,
    Streams,
    Tags,
    Worker,
    describe,
)

RATES = {"tx": 12.0, "producer": 8.0, "append": 8.0, "aappend": 4.0, "sw": 20.0, "generation": 0.5}
AAPPEND_TASKS = 4
STREAM_WRITERS = 2
# The writer that starts generations: one whose DATABASE is the database itself, where the task
# backend keeps the tasks (the other writes through the freezing proxy, another alias).
GENERATIONS_SLOT = 1
# Definite refusals: the write certainly stored nothing.
REFUSED = (pgstreams.StreamClosed, pgstreams.StreamNotFound)


class Rollback(Exception):
    """Raised inside a transaction to roll it back on purpose."""


class Writers:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.log = Log(worker.run_dir, worker.name)
        self.tag = Tags(worker.name)
        self.streams = Streams(worker.rng("streams"))
        self.seq: dict[str, int] = defaultdict(int)  # the producer's next seq per stream
        self.producer_id = f"py-{worker.role}{worker.slot}"

    # -- sync writers (threads) ----------------------------------------------------------------

    def thread(self, kind: str, step: Callable[[Any], None]) -> threading.Thread:
        rng = self.worker.rng(kind)

        def run() -> None:
            while not self.worker.settling():
                if self.streams.stale():
                    with contextlib.suppress(Error):
                        self.streams.refresh_sync()
                try:
                    step(rng)
                except Error:
                    connections.close_all()
                    time.sleep(0.2)
                time.sleep(rng.expovariate(RATES[kind]))
            connections.close_all()

        return threading.Thread(target=run, name=f"soak-{kind}", daemon=True)

    def tx(self, rng: Any) -> None:
        """One transaction: a write or a batch, sometimes a second stream, sometimes rolled back."""
        targets = [s for s in (self.streams.pick_open(), self.streams.pick_open() if rng.random() < 0.2 else None) if s]
        if not targets:
            return
        tx = self.tag("x")
        plan = [(s.path, s.id, [self.tag("t") for _ in range(rng.choice((1, 1, 2, 3)))]) for s in targets]
        roll_back = rng.random() < 0.2
        for path, _, data in plan:
            self.log(e="try", k="tx", s=path, d=data, tx=tx)
        offsets: list[list[int]] = []
        try:
            with transaction.atomic(using="default"):
                for _, sid, data in plan:
                    if len(data) == 1:
                        offsets.append([pgstreams.write(sid, data[0], using="default")])
                    else:
                        offsets.append(pgstreams.write_many(sid, data, using="default"))
                if roll_back:
                    raise Rollback
        except Rollback:
            for path, _, data in plan:
                self.log(e="rolledback", k="tx", s=path, d=data)
            return
        except REFUSED as exc:  # the transaction rolled back: nothing of it is stored
            for path, _, data in plan:
                self.log(e="err", k="tx", s=path, d=data, why=describe(exc), absent=True)
            return
        except Error as exc:  # perhaps committed, perhaps not
            for path, _, data in plan:
                self.log(e="err", k="tx", s=path, d=data, why=describe(exc), absent=False)
            raise
        for (path, _, data), got in zip(plan, offsets, strict=True):
            self.log(e="ok", k="tx", s=path, d=data, o=got, w="tx")

    def producer(self, rng: Any) -> None:
        """One idempotent batch, retried with the same producer, epoch and seq until it is stored."""
        stream = self.streams.pick_open()
        if stream is None:
            return
        data = [self.tag("p") for _ in range(rng.choice((1, 1, 2)))]
        batch = pgstreams.Producer(self.producer_id, self.worker.incarnation, self.seq[stream.path])
        self.log(e="try", k="producer", s=stream.path, d=data)
        failed = False
        for _ in range(600):  # bounded: about two minutes of failures
            try:
                if len(data) == 1:
                    got = pgstreams.write(stream.id, data[0], producer=batch, using="default")
                    offsets = None if got is None else [got]
                else:
                    offsets = pgstreams.write_many(stream.id, data, producer=batch, using="default") or None
            except REFUSED as exc:
                self.log(e="err", k="producer", s=stream.path, d=data, why=describe(exc), absent=not failed)
                return
            except Error as exc:
                failed = True
                self.log(e="retry", k="producer", s=stream.path, d=data, why=describe(exc))
                connections.close_all()
                time.sleep(0.2)
                continue
            self.seq[stream.path] += 1
            self.log(e="ok", k="producer", s=stream.path, d=data, o=offsets, w="producer")
            return
        self.log(e="err", k="producer", s=stream.path, d=data, why="gave up", absent=False)

    def generation(self, rng: Any) -> None:
        """Start a generation written by the ``db_worker`` processes' tasks at a model's pace:
        ``n`` chunks of text (``bench.tasks.count``), or an AI SDK answer of ``n`` words
        (``bench.tasks.answer``), its path saying which and ``n``. Its stream and task are made
        in one transaction, so a start either made both or neither."""
        n, kind = rng.randint(*GENERATION_CHUNKS), rng.choice(("count", "answer"))
        path = f"{GENERATIONS_PREFIX}{json.loads(self.tag('g'))}/{kind}/{n}"
        options = {
            "attempts": GENERATION_ATTEMPTS,
            "lease": GENERATION_LEASE,
            "queue_timeout": GENERATION_QUEUE,
            "using": "default",
        }
        stream = {"label": GENERATION_LABEL, "path": path}
        if kind == "answer":
            made = aisdk.start_generation(answer, n, TOKEN_DELAY, stream=stream, **options)
        else:
            stream["content_type"] = "text/plain"
            made = generations.start(count, n, TOKEN_DELAY, last=GAVE_UP, stream=stream, **options)
        self.log(e="generation", s=path, id=str(made.id))

    def append(self, rng: Any) -> None:
        stream = self.streams.pick_open()
        if stream is not None:
            self._append_result(stream.path, self.tag("a"), lambda data: pgstreams.append(stream.id, data), "append")

    def _append_result(self, path: str, data: str, call: Callable[[str], int], kind: str) -> None:
        self.log(e="try", k=kind, s=path, d=[data])
        try:
            offset = call(data)
        except pgstreams.OutcomeUnknown as exc:
            self.log(e="err", k=kind, s=path, d=[data], why=describe(exc), absent=False)
        except pgstreams.StreamError as exc:  # the append path reports an error only when nothing was stored
            self.log(e="err", k=kind, s=path, d=[data], why=describe(exc), absent=True)
        else:
            self.log(e="ok", k=kind, s=path, d=[data], o=[offset])

    # -- async writers -------------------------------------------------------------------------

    async def aappend_task(self, n: int) -> None:
        rng = self.worker.rng(f"aappend{n}")
        while not self.worker.settling():
            stream = self.streams.pick_open()
            if stream is not None:
                data = self.tag("q")
                self.log(e="try", k="aappend", s=stream.path, d=[data])
                try:
                    offset = await pgstreams.aappend(stream.id, data)
                except pgstreams.OutcomeUnknown as exc:
                    self.log(e="err", k="aappend", s=stream.path, d=[data], why=describe(exc), absent=False)
                except pgstreams.StreamError as exc:
                    self.log(e="err", k="aappend", s=stream.path, d=[data], why=describe(exc), absent=True)
                else:
                    self.log(e="ok", k="aappend", s=stream.path, d=[data], o=[offset], w=f"aappend{n}")
            await asyncio.sleep(rng.expovariate(RATES["aappend"]))

    async def stream_writer_task(self, n: int) -> None:
        """Sessions of a stream writer: a few dozen chunks sent without waiting, then the flush."""
        rng = self.worker.rng(f"sw{n}")
        while not self.worker.settling():
            stream = self.streams.pick_open()
            if stream is None:
                await asyncio.sleep(0.2)
                continue
            session = self.tag("s")
            sent: list[str] = []
            try:
                async with pgstreams.stream_writer(stream.id) as w:
                    for _ in range(rng.randint(5, 40)):
                        data = self.tag("w")
                        self.log(e="try", k="sw", s=stream.path, d=[data], sess=session)
                        sent.append(data)
                        await w.send(data)
                        await asyncio.sleep(rng.expovariate(RATES["sw"]))
            except pgstreams.StreamError as exc:
                self.log(e="err", k="sw", s=stream.path, d=sent, sess=session, why=describe(exc))
            else:
                self.log(e="ok", k="sw", s=stream.path, d=sent, sess=session)

    async def tasks(self) -> None:
        await asyncio.gather(
            *(self.aappend_task(n) for n in range(AAPPEND_TASKS)),
            *(self.stream_writer_task(n) for n in range(STREAM_WRITERS)),
        )


def main(worker: Worker) -> None:
    writers = Writers(worker)  # the streams are read by each thread as it starts (the server may be down)
    threads = [
        writers.thread("tx", writers.tx),
        writers.thread("producer", writers.producer),
        writers.thread("append", writers.append),
        threading.Thread(target=asyncio.run, args=(writers.tasks(),), name="soak-async", daemon=True),
    ]
    if worker.slot == GENERATIONS_SLOT:
        threads.append(writers.thread("generation", writers.generation))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writers.log(e="done")
