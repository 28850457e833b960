"""The notification buffer and flusher, observed from a real LISTEN connection."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

from pgstreams import db, notify
from pgstreams.types import Mark
from tests.helpers import heard, listen_everywhere

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def listen() -> Iterator[psycopg.Connection]:
    with db.connect("default", "test-listen") as conn:
        listen_everywhere(conn)
        yield conn


def test_buffer_keeps_one_entry_per_stream_highest_offset_wins(listen: psycopg.Connection) -> None:
    flusher = notify.Flusher(autostart=False)
    sid = uuid.uuid4()
    for n in (3, 9, 5):
        flusher.add([Mark(sid, n, False)])
    flusher.add([Mark(sid, 4, True)])
    assert flusher.depth() == 1
    flusher.flush()
    notes = heard(listen, [sid], until=bool, linger=0.3)
    assert [m for n in notes for m in n.marks] == [Mark(sid, 9, True)]


def test_more_than_8000_bytes_go_out_in_one_flush(listen: psycopg.Connection) -> None:
    flusher = notify.Flusher(autostart=False)
    marks = [Mark(uuid.uuid4(), i, False) for i in range(600)]  # about 24 KB of entries
    for mark in marks:
        flusher.add([mark])
    flusher.flush()
    notes = heard(listen, [m.stream_id for m in marks], until=lambda notes: sum(len(n.marks) for n in notes) >= 600)
    assert len(notes) >= 3
    assert len({n.pid for n in notes}) == 1
    assert sorted(m for n in notes for m in n.marks) == sorted(marks)
    assert flusher.stats.flushes == 1 and flusher.stats.payloads == len(notes)
    flusher.stop()


def test_failed_flush_is_counted_dropped_and_followed_by_a_reconnect(listen: psycopg.Connection) -> None:
    flusher = notify.Flusher(autostart=False)
    first = Mark(uuid.uuid4(), 1, False)
    flusher.add([first])
    flusher.flush()
    assert heard(listen, [first.stream_id], until=bool)
    with connection.cursor() as cursor:  # the timeout: gone, and the flusher told, when it returns
        cursor.execute("SELECT pg_terminate_backend(%s, 10000)", [flusher._conn.info.backend_pid])
    lost = Mark(uuid.uuid4(), 2, False)
    flusher.add([lost])
    flusher.flush()
    assert flusher.stats.failed_flushes == 1 and flusher.stats.dropped == 1
    after = Mark(uuid.uuid4(), 3, False)
    flusher.add([after])
    flusher.flush()
    notes = heard(listen, [lost.stream_id, after.stream_id], until=bool, linger=0.3)
    assert [m for n in notes for m in n.marks] == [after]
    flusher.stop()


def test_the_thread_flushes_a_write_without_being_asked(listen: psycopg.Connection) -> None:
    import pgstreams

    s = pgstreams.create_stream()
    pgstreams.write(s.id, "a")
    # Once, and only once: heard goes on listening for a while after the first.
    notes = heard(listen, [s.id], until=bool, linger=0.3)
    assert [m for n in notes for m in n.marks] == [Mark(s.id, 1, False)]
    assert any(t.name == "pgstreams-flusher" and t.daemon for t in threading.enumerate())


def test_every_write_is_announced_once_however_the_flushes_fall(listen: psycopg.Connection) -> None:
    """Eight threads write one chunk to each of 400 streams while the flusher runs: each stream
    is announced exactly once, whether its mark went out alone (the idle flusher sends at once)
    or in a batch (a busy one waits for the interval), and none again."""
    import pgstreams

    streams = [pgstreams.create_stream().id for _ in range(400)]

    def write(part: list[uuid.UUID]) -> None:
        for sid in part:
            pgstreams.write(sid, "a")
            time.sleep(0.001)
        connection.close()

    writers = [threading.Thread(target=write, args=(streams[k::8],)) for k in range(8)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    notes = heard(listen, streams, until=lambda notes: sum(len(n.marks) for n in notes) >= 400, linger=0.5)
    marks = [m for n in notes for m in n.marks]
    print(f"400 writes from 8 threads: {len(notes)} notifications")
    assert sorted(marks) == sorted(Mark(sid, 1, False) for sid in streams)


@pytest.mark.multiprocess
def test_final_flush_at_exit_sends_what_the_interval_held_back(listen: psycopg.Connection, spawn) -> None:
    import pgstreams

    s = pgstreams.create_stream()
    proc = spawn("exit", "--stream", str(s.id), "--count", "5", "--setting", "FLUSH_INTERVAL=3600")
    assert proc.wait(60) == 0, proc.stderr.read()
    notes = heard(listen, [s.id], until=lambda notes: sum(len(n.marks) for n in notes) >= 2, linger=0.3)
    marks = [m for n in notes for m in n.marks]
    # The first write is flushed at once; the other four wait for the interval, then exit.
    assert marks == [Mark(s.id, 1, False), Mark(s.id, 5, False)]


# A forked worker of a threaded server (gunicorn's preload) is what this test is about.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning")
def test_a_forked_child_starts_with_an_empty_buffer_and_its_own_flusher() -> None:
    parent = notify.flusher()
    parent._pending[uuid.uuid4()] = Mark(uuid.uuid4(), 1, False)  # pending, as if not yet flushed
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        child = notify.flusher()
        ok = child is not parent and child.depth() == 0
        os.write(write_end, b"1" if ok else b"0")
        os._exit(0)
    os.close(write_end)
    try:
        assert os.read(read_end, 1) == b"1"
    finally:
        os.waitpid(pid, 0)
        os.close(read_end)
        notify.stop_flusher()
