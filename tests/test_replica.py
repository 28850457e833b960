"""Durability levels and readers on a hot standby, against a real primary and synchronous
streaming standby built from the embedded binaries (the ``replica`` fixture)."""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.db import connections
from django.test import override_settings
from prometheus_client import REGISTRY

import pgstreams
from bench.replica import ReplicaPair
from pgstreams import listener, notify
from pgstreams.conf import SYNCHRONOUS_COMMIT_LEVELS
from tests.helpers import Reader

pytestmark = pytest.mark.multiprocess


@pytest.fixture
def on_the_pair(replica) -> Iterator[Any]:
    """pgstreams writes to the pair's primary and reads from its standby; the listener and the
    flusher are started inside the test, so they connect to the pair. Yields the pair."""
    pair, primary, standby = replica
    listener.stop_listener()
    notify.stop_flusher()
    with override_settings(PGSTREAMS={"DATABASE": primary, "READ_DATABASE": standby, "POLL_INTERVAL": 60}):
        yield pair
        listener.stop_listener()
        notify.stop_flusher()


class Write(threading.Thread):
    """One write at one synchronous_commit level, in its own thread and connection."""

    def __init__(self, alias: str, stream_id: uuid.UUID, level: str) -> None:
        super().__init__(name=f"write-{level}", daemon=True)
        self.alias, self.stream_id, self.level = alias, stream_id, level
        self.backend: queue.Queue[int] = queue.Queue()
        self.error: BaseException | None = None

    def run(self) -> None:
        conn = connections[self.alias]
        try:
            conn.ensure_connection()
            self.backend.put(conn.connection.info.backend_pid)
            pgstreams.write(self.stream_id, self.level, using=self.alias, synchronous_commit=self.level)
        except BaseException as exc:
            self.error = exc
        finally:
            conn.close()

    def finished(self) -> bool:
        self.join(30)
        return not self.is_alive() and self.error is None


def waits_for_the_standby(pair: Any, write: Write) -> bool:
    """Whether the write's commit is waiting for the standby (wait event SyncRep)."""
    pid = write.backend.get(timeout=30)
    with pair.connect("primary") as conn:
        deadline = time.monotonic() + 10
        while write.is_alive() and time.monotonic() < deadline:  # bounded
            row = conn.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
            if row and row[0] == "SyncRep":
                return True
            time.sleep(0.01)
    return False


def on_standby(pair: Any, stream_id: uuid.UUID) -> list[str]:
    with pair.connect("standby") as conn:
        rows = conn.execute(
            'SELECT data FROM pgstreams_chunk WHERE stream_id = %s ORDER BY "offset"', [stream_id]
        ).fetchall()
    return [data for (data,) in rows]


@pytest.mark.faults
def test_each_level_waits_for_what_it_promises(replica) -> None:
    pair, primary, _ = replica

    def write(level: str) -> Write:
        # A stream each: a commit waiting for the standby holds its stream's row lock.
        return Write(primary, pgstreams.create_stream(using=primary).id, level)

    # Replay paused: the standby still receives and flushes WAL, but applies none.
    with pair.replay_paused():
        done = [write(level) for level in ("off", "local", "remote_write", "on")]
        for w in done:
            w.start()
        assert all(w.finished() for w in done), [w.error for w in done]
        applied = write("remote_apply")
        applied.start()
        assert waits_for_the_standby(pair, applied)
    assert applied.finished(), applied.error
    # remote_apply returned only once the standby applied it: its readers see it already.
    assert on_standby(pair, applied.stream_id) == ["remote_apply"]

    # Standby down: only off and local commit; the others wait until it is back.
    local = [write(level) for level in ("off", "local")]
    remote = [write(level) for level in ("remote_write", "on")]
    with pair.standby_stopped():
        for w in local + remote:
            w.start()
        assert all(w.finished() for w in local), [w.error for w in local]
        assert all(waits_for_the_standby(pair, w) for w in remote)
    assert all(w.finished() for w in remote), [w.error for w in remote]


@pytest.mark.faults
def test_readers_on_a_lagging_standby_get_every_chunk_in_order_and_never_end_early(on_the_pair) -> None:
    pair = on_the_pair
    chunks = [f"chunk {i} " for i in range(100)]
    s = pgstreams.create_stream()
    pgstreams.write_many(s, chunks[:3])
    early = Reader(s.id, timeout=60)
    early.start()
    deadline = time.monotonic() + 30
    while len(early.got) < 3 and time.monotonic() < deadline:  # bounded
        time.sleep(0.01)
    assert early.got == list(enumerate(chunks[:3]))

    with pair.replay_paused():
        pgstreams.write_many(s, chunks[3:50])
        for data in chunks[50:]:
            pgstreams.write(s, data)
        pgstreams.close(s)
        # A stream the standby has not even got yet, and a reader resuming past what it shows.
        late = pgstreams.create_stream()
        pgstreams.write_many(late, ["a", "b"])
        pgstreams.close(late)
        late_reader = Reader(late.id, timeout=60)
        resumer = Reader(s.id, from_offset=40, timeout=60)
        late_reader.start()
        resumer.start()
        time.sleep(0.5)
        hub = listener.get_listener()
        # Announced (by notification and by this process's commits) but not replayed: waited for.
        assert early.is_alive() and late_reader.is_alive() and resumer.is_alive()
        assert early.got == list(enumerate(chunks[:3])) and late_reader.got == resumer.got == []
        assert early.error is late_reader.error is resumer.error is None

    resumed = time.monotonic()
    for reader in (early, late_reader, resumer):
        reader.join(30)
        assert not reader.is_alive() and reader.error is None, reader.error
    print(
        f"standby replay paused 0.5 s: readers complete {1000 * (time.monotonic() - resumed):.0f} ms after resume, "
        f"{hub.stats.read_behind} fetch rounds found the standby behind"
    )
    assert early.got == list(enumerate(chunks))
    assert resumer.got == list(enumerate(chunks))[40:]
    assert late_reader.got == [(0, "a"), (1, "b")]
    assert hub.stats.read_behind > 0  # the listener asked the standby again until it caught up
    assert REGISTRY.get_sample_value("pgstreams_read_behind_total") == hub.stats.read_behind
    # The chunks came from the standby: the fetcher is connected there, LISTEN on the primary.
    with pair.connect("standby") as conn:
        names = {n for (n,) in conn.execute("SELECT application_name FROM pg_stat_activity").fetchall()}
    assert f"pgstreams fetcher {os.getpid()}" in names
    assert hub.listening.is_set()


@pytest.mark.parametrize("entry", ["{hex}:999999999999", "{hex}:1:c"])
def test_a_notification_for_an_offset_not_reached_costs_a_reader_on_the_standby_one_round(on_the_pair, entry) -> None:
    """Announced further than the standby shows is what a lagging standby looks like: the listener
    asked it again, at most every 0.1 s, for as long as a reader waited, also when the
    announcement was false (anyone who may connect can NOTIFY). Now it asks the primary too."""
    pair = on_the_pair
    s = pgstreams.create_stream()
    pgstreams.write(s, "a", synchronous_commit="remote_apply")
    reader = Reader(s.id, timeout=30)
    reader.start()
    deadline = time.monotonic() + 30
    while reader.got != [(0, "a")] and time.monotonic() < deadline:  # bounded
        time.sleep(0.01)
    hub = listener.get_listener()
    before = hub.stats.snapshot()
    with pair.connect("primary") as conn:
        conn.execute("SELECT pg_notify(%s, %s)", [notify.channel_for(s.id), entry.format(hex=s.id.hex)])
    time.sleep(2.0)
    counted = hub.stats - before
    pgstreams.write(s, "b")
    pgstreams.close(s)
    reader.join(30)
    assert reader.got == [(0, "a"), (1, "b")] and reader.error is None
    print(f"a false announcement: {counted.fetches} fetch rounds in 2 s, {counted.read_behind} found it behind")
    assert counted.notifications >= 1 and counted.fetches <= 2 and counted.read_behind == 0


def test_every_level_is_accepted_on_the_pair(on_the_pair) -> None:
    pair = on_the_pair
    s = pgstreams.create_stream()
    for level in SYNCHRONOUS_COMMIT_LEVELS:
        pgstreams.write(s, level, synchronous_commit=level)
    pgstreams.close(s, synchronous_commit="remote_apply")
    assert on_standby(pair, s.id) == list(SYNCHRONOUS_COMMIT_LEVELS)
    assert [c.data for c in pgstreams.read(s.id, timeout=30)] == list(SYNCHRONOUS_COMMIT_LEVELS)


def test_a_pair_left_by_a_killed_process_is_stopped_and_removed_by_the_next() -> None:
    code = "from bench.replica import ReplicaPair; p = ReplicaPair(); p.start(); print(p.root, flush=True)"
    proc = subprocess.Popen(
        [sys.executable, "-c", code + "; import time; time.sleep(300)"], stdout=subprocess.PIPE, text=True
    )
    try:
        root = Path(proc.stdout.readline().strip())
        assert (root / "primary" / "postmaster.pid").exists()
    finally:
        proc.kill()
        proc.wait(10)
    pid = int((root / "primary" / "postmaster.pid").read_text().split()[0])
    with ReplicaPair():
        assert not root.exists()
    with contextlib.suppress(psutil.NoSuchProcess):  # gone, or exited and not yet reaped
        assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.faults
def test_an_append_whose_commit_got_no_answer_is_found_committed_and_reported_once(replica) -> None:
    """The commit waits for a stopped synchronous standby until QUERY_TIMEOUT cuts the
    appender's connection. The appender asks the primary, ends the backend that still waits
    (its transaction had committed locally), and reports the offset: one chunk, once."""
    from pgstreams import appender

    pair, primary, _ = replica
    appender.stop_appenders()
    with override_settings(PGSTREAMS={"DATABASE": primary, "QUERY_TIMEOUT": 1.0, "POLL_INTERVAL": 60}):
        s = pgstreams.create_stream()
        before = appender.appender(primary).stats.snapshot()
        result: list[object] = []
        with pair.standby_stopped():
            started = time.monotonic()
            result.append(pgstreams.append(s.id, "once"))
            took = time.monotonic() - started
        stats = appender.appender(primary).stats - before
        appender.stop_appenders()
        stored = list(
            connections[primary]
            .cursor()
            .execute('SELECT "offset", data FROM pgstreams_chunk WHERE stream_id = %s', [s.id])
            .fetchall()
        )
    print(f"an append whose commit got no answer was reported committed after {took:.1f} s: {stats}")
    assert result == [0] and stored == [(0, "once")]
    assert (stats.resolved, stats.retries, stats.batches) == (1, 0, 1)
