"""Generations: a stream written by a task of Django's Tasks API, which another worker takes over
when the one writing it dies or stops (or, given a ``stall`` time, hangs), so that an answer
outlives its worker.

``start()`` creates the stream and enqueues its task in one transaction: a stream is never
without its task, nor a task without its stream (the task backend must keep its tasks in
``DATABASE``, as django-tasks-db does). The task calls ``take()`` first: under the stream's row
lock it takes a new producer epoch, so that an earlier writer of the stream that is only paused
(a stopped process, a long pause, a partition) is fenced, its writes refused and never stored;
it gets the chunks stored so far (read once the lock is let go), to go on from there; and the
``Taken`` it returns keeps a lease on the stream while the task writes through it.

Each process that started or took a generation runs one generations thread, on one connection:
it renews the leases of the generations the process writes (while they make progress, a write
within ``stall`` seconds, for those started with one), and looks for generations whose lease
ran out. The first to look takes one over (``FOR UPDATE SKIP LOCKED``: one process, once): it
counts an attempt, fences the run that held it (a new producer epoch: its writes and renewals
are refused from then on) and enqueues the task again, in one transaction, the lease then
counting the time the task may wait for a worker; once a worker starts the run (the Tasks API's
``task_started`` signal) it counts ``lease`` again, so that a worker that dies before ``take()``
is taken over as soon as one that dies after. A run that ends without ending its generation
(its task failed before or after ``take()``) gives the lease up as its task finishes
(``task_finished``), so the next look takes it over at once. After its last attempt a
generation ends with its ``last`` chunk. A closed stream (finished, stopped) is never taken nor
taken over.

A stalled process holds a generation's row at most ``db.idle_bound()`` (half of QUERY_TIMEOUT):
each transaction of pgstreams' own that locks it (the appender's, ``take()``'s, a takeover's)
ends the session of a client that leaves it idle that long.

Not here: what the task writes (the project's), running the tasks (the task backend's workers),
and who may read the stream.
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
import time
import uuid
from collections.abc import Callable
from importlib import import_module
from types import TracebackType
from typing import Any, Final

from django.db import DatabaseError, connections, transaction
from django.utils.module_loading import import_string

from . import appends, conf, contents, db, leases, producers
from .exceptions import OutcomeUnknown, StreamClosed, StreamError, StreamNotFound
from .models import Stream
from .process import PerProcess
from .types import Producer, stream_uuid
from .writer import create_stream

_random = random.Random()  # its own: the global state a project may seed is left alone
logger = logging.getLogger("pgstreams.generations")

KEY: Final = "pgstreams_generation"
PRODUCER: Final = "pgstreams-generation"  # the producer id every writer of a generation writes as
ATTEMPTS: Final = 3  # runs of a generation's task at most, by default: its first and two takeovers
LEASE: Final = 10.0  # seconds a taken generation is kept for its writer without a renewal
QUEUE_TIMEOUT: Final = 600.0  # seconds an enqueued attempt may wait for a worker, by default
TAKEOVER_INTERVAL: Final = 1.0  # seconds between a process's looks for generations to take over
RETRY: Final = 0.5  # seconds before a failed lease renewal is tried again, at most

# Open generations whose lease has run out, locked by this process only (another skips them).
_EXPIRED_SQL: Final = (
    "SELECT id, metadata->'pgstreams_generation', metadata->'pgstreams_lease'->>'last' FROM pgstreams_stream"
    " WHERE closed_at IS NULL AND metadata ? 'pgstreams_generation'"
    " AND (metadata->'pgstreams_lease'->>'until')::float8 < extract(epoch FROM now())"
    " ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED"
)
# A takeover: one attempt more, the epoch that fences the run before, and the lease the time the
# new attempt may wait for a worker.
_NEXT_ATTEMPT_SQL: Final = (
    "UPDATE pgstreams_stream SET metadata = jsonb_set(metadata, '{pgstreams_lease,until}',"
    " to_jsonb(extract(epoch FROM now()) + %s)) || jsonb_build_object('pgstreams_generation',"
    " metadata->'pgstreams_generation' || jsonb_build_object("
    "'attempt', (metadata->'pgstreams_generation'->>'attempt')::int + 1, 'epoch', %s::bigint))"
    " WHERE id = %s"
)
# The task result of the attempt just enqueued: the run whose end gives the lease up (_GIVE_UP_SQL).
_RESULT_SQL: Final = (
    "UPDATE pgstreams_stream SET metadata = jsonb_set(metadata, '{pgstreams_generation,result}', to_jsonb(%s::text))"
    " WHERE id = %s"
)
# A take: the stream's row, locked, its generation and how many chunks it holds.
_TAKE_SQL: Final = (
    "SELECT closed_at IS NOT NULL, metadata->'pgstreams_generation', next_offset FROM pgstreams_stream"
    " WHERE id = %s AND deleted_at IS NULL FOR UPDATE"
)
_STORED_SQL: Final = 'SELECT data FROM pgstreams_chunk WHERE stream_id = %s AND "offset" < %s ORDER BY "offset"'
_EPOCH_SQL: Final = "SELECT epoch FROM pgstreams_producer WHERE stream_id = %s AND producer_id = %s"
# A renewal by the run that holds ``epoch``; after a takeover or another take it renews nothing.
_RENEW_SQL: Final = (
    "UPDATE pgstreams_stream SET metadata = jsonb_set(metadata, '{pgstreams_lease,until}',"
    " to_jsonb(extract(epoch FROM now()) + %s)) WHERE id = %s AND closed_at IS NULL"
    " AND (metadata->'pgstreams_generation'->>'epoch')::bigint = %s"
)
# The lease given up by the run of task result ``result``, if it is the generation's current one.
_GIVE_UP_SQL: Final = (
    "UPDATE pgstreams_stream SET metadata = jsonb_set(metadata, '{pgstreams_lease,until}', to_jsonb(0))"
    " WHERE id = %s AND closed_at IS NULL AND metadata->'pgstreams_generation'->>'result' = %s"
)
# The run of task result ``result`` has started: the lease, which counted the wait for a worker
# (queue_timeout), counts ``lease`` from now, so that a worker that dies before ``take()`` is
# taken over as soon as one that dies after it. It only ever shortens: a late or repeated
# signal never brings back a lease given up.
_STARTED_SQL: Final = (
    "UPDATE pgstreams_stream SET metadata = jsonb_set(metadata, '{pgstreams_lease,until}',"
    " to_jsonb(least((metadata->'pgstreams_lease'->>'until')::float8,"
    " extract(epoch FROM now()) + (metadata->'pgstreams_generation'->>'lease')::float8)))"
    " WHERE id = %s AND closed_at IS NULL AND metadata->'pgstreams_generation'->>'result' = %s"
)
_TAKEN_SQL: Final = (
    "UPDATE pgstreams_stream SET metadata = jsonb_set(metadata, '{pgstreams_generation,epoch}', to_jsonb(%s::bigint))"
    " WHERE id = %s"
)


def start(
    task: Any,
    *args: Any,
    last: str,
    attempts: int = ATTEMPTS,
    lease: float = LEASE,
    queue_timeout: float = QUEUE_TIMEOUT,
    stall: float | None = None,
    stream: dict[str, Any] | None = None,
    using: str | None = None,
    **kwargs: Any,
) -> Stream:
    """Create a stream and enqueue ``task(str(stream.id), *args, **kwargs)`` to write it, in one
    transaction (a savepoint of the caller's, if it is in one).

    Args:
        task: a task of Django's Tasks API (``@task``), whose backend keeps its tasks in
            ``DATABASE``; its arguments must be JSON, as the API asks.
        last: the chunk that ends the stream when every attempt has failed (its content type's).
        attempts: how many times the task is run at most: its first run and the takeovers.
        lease: seconds a writer may go without renewing its lease (``Taken`` renews it a third
            of that apart) before the generation is taken over.
        queue_timeout: seconds an attempt may wait for a worker before it counts as failed.
        stall: seconds a run may go without writing (or calling ``Taken.progress()``) before
            its lease is left to run out, so that a run stuck in a model call is taken over
            (give it more than the model's longest wait for its first token); None, by
            default, watches only that the run's process is alive.
        stream: ``create_stream()``'s arguments (owner, label, content_type, path...).

    Raises:
        InvalidChunk: ``last`` is not a chunk the stream can hold (nothing is made); ValueError
            for a lease, queue_timeout, stall or attempts out of range, or arguments that are
            not JSON Postgres can store (a NUL character, a lone surrogate).
    """
    for name, value in (("lease", lease), ("queue_timeout", queue_timeout), ("stall", stall)):
        if value is None and name == "stall":
            continue
        if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} is a number of seconds above 0, not {value!r}")
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"attempts is a whole number, 1 or more, not {attempts!r}")
    _check_storable([list(args), kwargs])
    alias = using or conf.database()
    generation = {
        "task": task.module_path,
        "args": list(args),
        "kwargs": kwargs,
        "attempt": 1,
        "attempts": attempts,
        "lease": lease,
        "queue_timeout": queue_timeout,
        "stall": stall,
        "epoch": -1,
    }
    with transaction.atomic(using=alias):
        made = create_stream(using=alias, **(stream or {}))
        # Its last chunk ends the stream one day, in another process: refused now if it cannot.
        contents.check_fits(contents.kind_of(made.content_type), last, made.id)
        with connections[alias].cursor() as cursor:
            cursor.execute(
                "UPDATE pgstreams_stream SET metadata = metadata || jsonb_build_object(%s::text, %s::jsonb)"
                " WHERE id = %s",
                [KEY, json.dumps(generation), made.id],
            )
            leases.renew(made.id, queue_timeout, last, using=alias)
            # Last: a backend that runs the task at once (ImmediateBackend) finds it ready.
            cursor.execute(_RESULT_SQL, [str(task.enqueue(str(made.id), *args, **kwargs).id), made.id])
    _thread.get()  # this process looks for takeovers from now on
    return made


def _check_storable(value: Any) -> None:
    """Raise ValueError if ``value`` is not JSON that Postgres can store."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"a generation's task arguments must be JSON ({exc})") from None
    if (problem := contents.unstorable(value)) is not None:
        raise ValueError(f"a generation's task arguments hold {problem}, which Postgres cannot store; remove it")


def take(stream_id: Any, *, using: str | None = None) -> Taken:
    """Take a generation's stream for this run of its task: a new producer epoch (an earlier
    writer's writes are refused from now on), the lease from now, the chunks stored so far.
    Use the ``Taken`` as a context manager: its lease is renewed while the block runs.

    Raises:
        StreamClosed: the generation ended (finished, stopped, or out of attempts): the task has
            nothing to do.
        StreamNotFound: no such stream; ValueError: a stream that is not a generation.
    """
    sid = stream_uuid(stream_id)
    alias = using or conf.database()
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        db.bound_idle(alias, cursor)  # the row is locked from here: a stalled process holds it no longer
        cursor.execute(_TAKE_SQL, [sid])
        row = cursor.fetchone()
        if row is None:
            raise StreamNotFound(f"no stream {sid}")
        closed, generation, stored = row
        if closed:
            raise StreamClosed(f"the generation in stream {sid} has ended")
        if generation is None:
            raise ValueError(f"stream {sid} is not a generation (pgstreams.generations.start() makes them)")
        generation = json.loads(generation) if isinstance(generation, str) else generation
        epoch = _fence(cursor, sid)
        cursor.execute(_TAKEN_SQL, [epoch, sid])
        cursor.execute(_RENEW_SQL, [generation["lease"], sid, epoch])
    # Read once the row is free: a process stopped while the server sends it a long answer
    # holds no lock (the idle bound does not count while a statement runs). The chunks below
    # ``stored`` change no more, and every earlier run is fenced.
    with connections[alias].cursor() as cursor:
        cursor.execute(_STORED_SQL, [sid, stored])
        chunks = [data for (data,) in cursor.fetchall()]
    _thread.get()  # this process looks for takeovers from now on
    stall = generation.get("stall")
    return Taken(sid, alias, epoch, generation["attempt"], float(generation["lease"]), stall, chunks)


class Taken:
    """One run's hold on a generation: ``chunks`` is what was stored before it; ``write()`` and
    ``close()`` append as its producer epoch (``ProducerFenced`` once the run was taken over or
    another run has taken the stream; ``StreamClosed`` once it ended). As a context manager it
    keeps the lease: this process's generations thread renews it while the block runs and the
    run makes progress (a write, or ``renew()``, within ``stall`` seconds)."""

    def __init__(
        self,
        stream_id: uuid.UUID,
        alias: str,
        epoch: int,
        attempt: int,
        lease: float,
        stall: float | None,
        chunks: list[str],
    ) -> None:
        self.stream_id, self.alias, self.epoch, self.attempt, self.lease = stream_id, alias, epoch, attempt, lease
        self.stall = stall
        self.chunks = chunks
        self.progressed_at = time.monotonic()
        self._seq = 0
        self._unknown: tuple[str, bool] | None = None  # a write whose outcome is unknown: (data, close)
        self._holder: _Thread | None = None

    def write(self, data: str, *, close: bool = False) -> int | None:
        """Append ``data`` (and close the stream with it, with ``close``); its offset (None for
        a write sent again that had been stored). After OutcomeUnknown, write the same ``data``
        again: it is stored once; anything else raises StreamError, since it would take the
        place of a write that may have been stored."""
        if self._unknown is not None and self._unknown != (data, close):
            raise StreamError(
                f"the last write to generation {self.stream_id} may or may not have been stored (OutcomeUnknown): "
                "write the same data again first, or let the run end and be taken over"
            )
        producer = Producer(PRODUCER, self.epoch, self._seq)
        try:
            offset = appends.append(self.stream_id, data, close=close, producer=producer, using=self.alias)
        except OutcomeUnknown:
            self._unknown = (data, close)
            raise
        self._unknown = None
        self._seq += 1  # only once written: a refused write takes no place in the sequence
        self.progressed_at = time.monotonic()
        return offset

    def close(self, data: str) -> int | None:
        """End the generation with its last chunk ``data``."""
        return self.write(data, close=True)

    def progress(self) -> None:
        """Count as progress, as a write does: for a run that works longer than ``stall``
        between two writes (a tool call, say), so that its lease goes on being renewed."""
        self.progressed_at = time.monotonic()

    def stalled(self, now: float) -> bool:
        """Whether the run has gone ``stall`` seconds without progress."""
        return self.stall is not None and now - self.progressed_at > self.stall

    def renew(self) -> None:
        """Renew the lease from now, if this run still holds the generation (after a takeover,
        another take, or once it ended, nothing changes)."""
        with connections[self.alias].cursor() as cursor:
            cursor.execute(_RENEW_SQL, [self.lease, self.stream_id, self.epoch])

    def __enter__(self) -> Taken:
        self._holder = _thread.get()
        self._holder.hold(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self._holder is not None:
            self._holder.release(self)


def take_over_expired(*, using: str | None = None, limit: int = 100) -> int:
    """Take over up to ``limit`` generations whose lease has run out, as one process: fence the
    run that held each and enqueue its task again (one attempt more), or end those out of
    attempts with their last chunk. Return how many were taken over or ended."""
    alias = using or conf.database()
    ended: list[tuple[uuid.UUID, str]] = []
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        db.bound_idle(alias, cursor)
        cursor.execute(_EXPIRED_SQL, [limit])
        rows = cursor.fetchall()
        for sid, value, last in rows:
            generation = json.loads(value) if isinstance(value, str) else value
            if generation["attempt"] >= generation["attempts"]:
                logger.warning("pgstreams: generation %s lost its writer on its last attempt; ending it", sid)
                ended.append((sid, last))
                continue
            try:
                with transaction.atomic(using=alias):  # a savepoint: one that fails leaves the others
                    task = import_string(generation["task"])
                    cursor.execute(_NEXT_ATTEMPT_SQL, [generation["queue_timeout"], _fence(cursor, sid), sid])
                    result = task.enqueue(str(sid), *generation["args"], **generation["kwargs"])
                    cursor.execute(_RESULT_SQL, [str(result.id), sid])
            except DatabaseError:
                raise  # the look fails, and the next one tries again
            except Exception:  # not importable here (another project's task, say): left to one that can
                logger.warning(
                    "pgstreams: could not enqueue the task of generation %s again here; left to another process",
                    sid,
                    exc_info=True,
                )
                continue
            logger.warning(
                "pgstreams: generation %s lost its writer; attempt %d of %d enqueued",
                sid,
                generation["attempt"] + 1,
                generation["attempts"],
            )
    for sid, last in ended:
        try:
            appends.append(sid, last, close=True, using=alias)
        except StreamError as exc:  # ended meanwhile (by its writer, another process), or deleted
            logger.info("pgstreams: generation %s was not ended here: %s", sid, exc)
    return len(rows)


def _fence(cursor: Any, sid: uuid.UUID) -> int:
    """Take the next producer epoch of a generation whose row the transaction holds: every run
    before is refused from now on. Returns it."""
    cursor.execute(_EPOCH_SQL, [sid, PRODUCER])
    previous = cursor.fetchone()
    epoch = 0 if previous is None else previous[0] + 1
    producers.save(cursor, sid, Producer(PRODUCER, epoch, -1))
    return epoch


def give_up(stream_id: Any, result_id: str, *, using: str | None = None) -> bool:
    """Let the lease of a generation run out now if its current run is the task result
    ``result_id`` (which has finished): the next look takes it over. True if it did."""
    with connections[using or conf.database()].cursor() as cursor:
        cursor.execute(_GIVE_UP_SQL, [stream_uuid(stream_id), str(result_id)])
        return cursor.rowcount > 0


def _task_started(sender: Any, task_result: Any, **kwargs: Any) -> None:
    """The Tasks API's ``task_started``, in the worker about to run the task: a generation's
    lease counts its ``lease`` from now, no longer the wait for a worker, so that a worker that
    dies before ``take()`` (killed, or unable to record the failure on a connection a failover
    cut) leaves the answer waiting ``lease``, not ``queue_timeout``. Any other task is left alone.
    In pgstreams' ``DATABASE`` only, as ``give_up``: a generation started ``using`` another alias
    keeps counting its wait for a worker until ``take()``."""
    if (sid := _generation_of(task_result)) is None:
        return
    try:
        with connections[conf.database()].cursor() as cursor:
            cursor.execute(_STARTED_SQL, [sid, str(task_result.id)])
    except Exception:  # never raised to the worker, which would not run the task
        logger.warning("pgstreams: could not start the lease of generation %s", sid, exc_info=True)


def _task_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
    """The Tasks API's ``task_finished``, in the worker that ran the task: a generation's run
    that ended without ending it gives its lease up, rather than leave the answer waiting for
    the lease to run out. Any other task is left alone."""
    if (sid := _generation_of(task_result)) is None:
        return
    try:
        if give_up(sid, task_result.id):
            logger.warning("pgstreams: the run of generation %s ended without ending it; taken over next", sid)
    except Exception:  # never raised to the worker, which would count the task failed; the look
        # finds the generation once its lease runs out
        logger.warning("pgstreams: could not give up the lease of generation %s", sid, exc_info=True)


def _generation_of(task_result: Any) -> uuid.UUID | None:
    """The stream id a task result's run was given first, if it looks like a generation's (the
    SQL that uses it matches the generation's recorded task result, so no other task is touched)."""
    args = getattr(task_result, "args", None)
    if not args or not isinstance(args[0], str):
        return None
    try:
        return uuid.UUID(args[0])
    except ValueError:
        return None  # not a generation's task: its first argument is no stream id


def connect_signals() -> None:
    """Receive ``task_started`` and ``task_finished`` from whichever Tasks API is installed
    (Django's own from 6.0, the django-tasks backport): called once, by the app's ``ready()``."""
    for module in ("django.tasks.signals", "django_tasks.signals"):
        try:
            signals = import_module(module)
        except ImportError:
            continue
        signals.task_started.connect(_task_started, dispatch_uid=f"pgstreams-generations-started-{module}")
        signals.task_finished.connect(_task_finished, dispatch_uid=f"pgstreams-generations-{module}")


class _Thread:
    """This process's generations thread, "pgstreams-generations", on one connection: it renews
    the lease of each generation this process writes (a third of the lease apart) and every
    TAKEOVER_INTERVAL (jittered) looks for generations to take over (``take_over_expired``)."""

    def __init__(self) -> None:
        self._held: dict[Taken, float] = {}  # each held generation, and when to renew it next
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="pgstreams-generations", daemon=True)
        self._thread.start()

    def hold(self, taken: Taken) -> None:
        with self._lock:
            self._held[taken] = time.monotonic() + taken.lease / 3
        self._wake.set()

    def release(self, taken: Taken) -> None:
        with self._lock:
            self._held.pop(taken, None)

    def _run(self) -> None:
        look = time.monotonic() + _jittered()
        try:
            while not self._stopping:
                now = time.monotonic()
                with self._lock:
                    due = [taken for taken, at in self._held.items() if at <= now]
                for taken in due:
                    if taken.stalled(now):  # renewed no more: its lease runs out, and it is taken over
                        logger.warning(
                            "pgstreams: generation %s made no progress for %s s; its lease is left to run out",
                            taken.stream_id,
                            taken.stall,
                        )
                        self.release(taken)
                        continue
                    renewed = self._step(taken.renew, f"renewing the lease of generation {taken.stream_id}")
                    # After a failure, again soon: two renewals missed in a row lose the lease.
                    later = taken.lease / 3 if renewed else min(RETRY, taken.lease / 10)
                    with self._lock:
                        if taken in self._held:
                            self._held[taken] = now + later
                if now >= look:
                    self._step(take_over_expired, "looking for generations to take over")
                    look = now + _jittered()
                with self._lock:
                    wake = min([look, *self._held.values()])
                self._wake.wait(max(0.0, wake - time.monotonic()))
                self._wake.clear()
        finally:
            connections.close_all()

    def _step(self, step: Callable[[], Any], what: str) -> bool:
        """Run ``step``; False if it failed (logged, and the connection closed)."""
        try:
            step()
        except Exception:  # a database blip must not end the thread: the next round may succeed
            logger.warning("pgstreams: %s failed", what, exc_info=True)
            connections.close_all()
            return False
        return True

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)

    def alive(self) -> bool:
        return self._thread.is_alive()


def _jittered() -> float:
    return TAKEOVER_INTERVAL * _random.uniform(0.8, 1.2)


_thread: PerProcess[_Thread] = PerProcess(_Thread, _Thread.stop, alive=_Thread.alive)
stop_thread = _thread.stop  # stop this process's generations thread; the next start or take starts another
