"""Notifications: the payload format and the per-process buffer with its flusher thread.

A notification only says "stream X has reached offset N" (and whether it is closed); readers
then read the table. The buffer keeps one entry per stream (highest offset wins), and the flusher
sends all of it in one transaction on its own connection, so the global lock Postgres takes to
commit a NOTIFY is taken once per flush instead of once per write. This module never reads chunks
and never runs in the writer's transaction.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import psycopg

from . import conf, db, guard, metrics
from .process import PerProcess
from .stats import FlusherStats
from .types import Mark

logger = logging.getLogger("pgstreams.notify")

# Postgres refuses a NOTIFY payload of 8000 bytes or more.
PAYLOAD_LIMIT = 7999
# At most this many streams wait in one process's buffer; beyond it entries are dropped (and
# counted), and readers' polling delivers those chunks.
MAX_PENDING = 100_000


def encode(mark: Mark) -> str:
    entry = f"{mark.stream_id.hex}:{mark.next_offset}"
    return entry + ":c" if mark.closed else entry


def decode_entry(entry: str) -> Mark | None:
    """Parse one entry of a payload; None (logged, never fatal) for one that is not ours."""
    hex_id, _, state = entry.partition(":")
    try:
        return Mark(uuid.UUID(hex=hex_id), *decode_state(state))
    except ValueError:
        logger.debug("ignoring notification entry %r", entry)
        return None


def decode_state(state: str) -> tuple[int, bool]:
    """What an entry says after its stream's id and colon: its next_offset, and whether it is
    closed; ValueError if it says no offset."""
    offset, _, flag = state.partition(":")
    return int(offset), flag == "c"


def decode(payload: str) -> Iterator[Mark]:
    """Parse a payload's entries, skipping those that are not ours: the format's whole reading,
    ``encode``'s inverse (the listener reads only what follows the ids of streams it follows,
    with ``decode_state``)."""
    for entry in payload.split(","):
        mark = decode_entry(entry)
        if mark is not None:
            yield mark


def shard_of(stream_id: uuid.UUID) -> int:
    """The notification shard of a stream (NOTIFY_SHARDS)."""
    return stream_id.int % conf.notify_shards()


def channel_of(shard: int) -> str:
    """A shard's channel: CHANNEL itself when there is one shard, else ``<CHANNEL>_<shard>``."""
    return conf.channel() if conf.notify_shards() == 1 else f"{conf.channel()}_{shard}"


def channel_for(stream_id: uuid.UUID) -> str:
    return channel_of(shard_of(stream_id))


def notes(marks: Iterable[Mark]) -> tuple[list[str], list[str]]:
    """The notifications that announce ``marks``, as (channels, payloads): each stream's entry
    on its shard's channel, a shard's entries packed into as few payloads as fit."""
    shards = conf.notify_shards()
    by_shard: dict[int, list[Mark]] = {}
    for mark in marks:
        by_shard.setdefault(mark.stream_id.int % shards, []).append(mark)
    channels: list[str] = []
    payloads: list[str] = []
    for shard, group in by_shard.items():
        packed = pack(group)
        channels += [channel_of(shard)] * len(packed)
        payloads += packed
    return channels, payloads


def pack(marks: Iterable[Mark], limit: int = PAYLOAD_LIMIT) -> list[str]:
    """Join encoded marks with commas into as few payloads as fit under ``limit`` bytes each."""
    payloads: list[str] = []
    current: list[str] = []
    size = 0
    for mark in marks:
        entry = encode(mark)  # ASCII: characters are bytes
        if current and size + 1 + len(entry) > limit:
            payloads.append(",".join(current))
            current, size = [], 0
        size += len(entry) + (1 if current else 0)
        current.append(entry)
    if current:
        payloads.append(",".join(current))
    return payloads


# A notification is a hint, not data: its commit need not wait for the WAL to reach the disk,
# which also shortens the time the global NOTIFY lock is held. The level is set for this
# statement's transaction only (set_config's third argument), never for the session: behind
# PgBouncer in transaction mode the server connection goes on to serve other clients.
NOTIFY_SQL = """
SELECT pg_notify(channel, payload), pg_notification_queue_usage()
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS local,
     unnest(%s::text[], %s::text[]) AS note(channel, payload)
"""


class Flusher:
    """One process's notification buffer and the named daemon thread that drains it.

    ``add()`` never blocks on the database. The thread flushes as soon as something is pending,
    then waits ``FLUSH_INTERVAL`` before the next flush, so an idle process notifies at once and
    a busy one notifies at most once per interval, with everything written meanwhile. Every
    flush is bounded by QUERY_TIMEOUT (``db.watched``), so a connection whose peer vanished
    delays notifications, and the process's exit, by that much at most.
    """

    def __init__(self, *, autostart: bool = True) -> None:
        self._autostart = autostart  # False: no thread; flush() is called by hand (tests)
        self._lock = threading.Lock()
        self._pending: dict[uuid.UUID, Mark] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._backoff = db.Backoff()
        self.stats = FlusherStats()

    def add(self, marks: Iterable[Mark]) -> None:
        with self._lock:
            for mark in marks:
                old = self._pending.get(mark.stream_id)
                if old is not None:
                    mark = Mark(mark.stream_id, max(old.next_offset, mark.next_offset), old.closed or mark.closed)
                elif len(self._pending) >= MAX_PENDING:
                    self.stats.dropped += 1
                    continue
                self._pending[mark.stream_id] = mark
            if self._thread is None and self._autostart:
                self._thread = threading.Thread(target=self._run, name="pgstreams-flusher", daemon=True)
                self._thread.start()
        if not self._wake.is_set():  # set() takes a lock: skip it while a flush is already due
            self._wake.set()

    def depth(self) -> int:
        return len(self._pending)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            started = time.monotonic()
            delay = self.flush()
            # At most one flush per interval; longer after a failure.
            self._stop.wait(max(delay, conf.flush_interval() - (time.monotonic() - started)))
        self.flush()  # the final flush
        self._close()

    def flush(self) -> float:
        """Send everything pending in one transaction; return how long to wait before the next.

        A failed flush is logged, its notifications are dropped and counted (readers' polling
        covers them), and the next flush reconnects.
        """
        with self._lock:
            batch, self._pending = self._pending, {}
        if not batch:
            return 0.0
        channels, payloads = notes(batch.values())
        started = time.monotonic()
        try:
            if self._conn is None or self._conn.closed:
                self._conn = db.connect(conf.database(), "flusher")
            with db.watched(self._conn, "flushing notifications"):
                usage = self._conn.execute(NOTIFY_SQL, (channels, payloads)).fetchone()[1]
        except Exception as exc:  # a database blip must not kill the thread
            self.stats.dropped += len(batch)
            self.stats.failed_flushes += 1
            logger.warning(
                "pgstreams: could not send %d notification(s), readers will catch up by polling: %s",
                len(batch),
                exc,
            )
            self._close()
            return self._backoff.next()
        self._backoff.reset()
        metrics.flush_seconds.observe(time.monotonic() - started)
        metrics.flush_batch.observe(len(batch))
        self.stats.flushes += 1
        self.stats.notified += len(batch)
        self.stats.payloads += len(payloads)
        if guard.due(usage):
            self._guard(usage)
        return 0.0

    def _guard(self, usage: float) -> None:
        """End the listeners that pin the notification queue (guard.py)."""
        try:
            with db.watched(self._conn, "ending stuck listeners"):
                guard.look(self._conn, usage)
        except Exception as exc:  # the flush went through; the next one reconnects
            logger.warning("pgstreams: could not look for stuck listeners: %s", exc)
            self._close()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the thread after a final flush of what is pending (the flush at exit).

        The thread flushes, so a flush it is still waiting on is never joined by a second one.
        Waits at most ``timeout`` seconds (by default long enough for a connect and a query); a
        thread still busy then is left behind, as a daemon, with a warning.
        """
        if self._thread is None:  # never started (autostart=False): flush from here
            self.flush()
            self._close()
            return
        if timeout is None:
            timeout = conf.connect_timeout() + conf.query_timeout() + 1
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("pgstreams: flusher thread did not stop within %.1f s", timeout)

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            db.close_blocking_quietly(conn)


_flushers: PerProcess[Flusher] = PerProcess(Flusher, Flusher.stop)
flusher = _flushers.get  # this process's flusher, made on first use
current_flusher = _flushers.current  # the flusher if it was made, without making one
stop_flusher = _flushers.stop  # stop it after a final flush; the next write makes a new one
