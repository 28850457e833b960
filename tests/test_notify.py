"""The notification buffer and flusher, observed from a real LISTEN connection."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

from pgstreams import db, notify
from pgstreams.types import Mark

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def listen() -> Iterator[psycopg.Connection]:
    with db.connect("default", "test-listen") as conn:
        conn.execute("LISTEN pgstreams")
        yield conn


def received(conn: psycopg.Connection, until: int, timeout: float = 10.0) -> list[psycopg.Notify]:
    """Notifications on ``conn`` until ``until`` marks have arrived (or the timeout)."""
    notes: list[psycopg.Notify] = []
    deadline = time.monotonic() + timeout
    while sum(len(list(notify.decode(n.payload))) for n in notes) < until and time.monotonic() < deadline:
        notes.extend(conn.notifies(timeout=0.2))
    return notes


def test_buffer_keeps_one_entry_per_stream_highest_offset_wins(listen: psycopg.Connection) -> None:
    flusher = notify.Flusher(autostart=False)
    sid = uuid.uuid4()
    for n in (3, 9, 5):
        flusher.add([Mark(sid, n, False)])
    flusher.add([Mark(sid, 4, True)])
    assert flusher.depth() == 1
    flusher.flush()
    notes = received(listen, 1)
    assert [m for n in notes for m in notify.decode(n.payload)] == [Mark(sid, 9, True)]


def test_more_than_8000_bytes_go_out_in_one_flush(listen: psycopg.Connection) -> None:
    flusher = notify.Flusher(autostart=False)
    marks = [Mark(uuid.uuid4(), i, False) for i in range(600)]  # about 24 KB of entries
    for mark in marks:
        flusher.add([mark])
    flusher.flush()
    notes = received(listen, len(marks))
    assert len(notes) >= 3
    assert len({n.pid for n in notes}) == 1
    assert sorted(m for n in notes for m in notify.decode(n.payload)) == sorted(marks)
    assert flusher.stats.flushes == 1 and flusher.stats.payloads == len(notes)
    flusher.stop()


def test_failed_flush_is_counted_dropped_and_followed_by_a_reconnect(listen: psycopg.Connection) -> None:
    flusher = notify.Flusher(autostart=False)
    flusher.add([Mark(uuid.uuid4(), 1, False)])
    flusher.flush()
    assert received(listen, 1)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [flusher._conn.info.backend_pid])
    lost = Mark(uuid.uuid4(), 2, False)
    flusher.add([lost])
    flusher.flush()
    assert flusher.stats.failed_flushes == 1 and flusher.stats.dropped == 1
    after = Mark(uuid.uuid4(), 3, False)
    flusher.add([after])
    flusher.flush()
    notes = received(listen, 1)
    assert [m for n in notes for m in notify.decode(n.payload)] == [after]
    flusher.stop()


def test_the_thread_flushes_a_write_without_being_asked(listen: psycopg.Connection) -> None:
    import pgstreams

    s = pgstreams.create_stream()
    pgstreams.write(s.id, "a")
    notes = received(listen, 1)
    assert [m for n in notes for m in notify.decode(n.payload)] == [Mark(s.id, 1, False)]
    assert any(t.name == "pgstreams-flusher" and t.daemon for t in __import__("threading").enumerate())


@pytest.mark.multiprocess
def test_final_flush_at_exit_sends_what_the_interval_held_back(listen: psycopg.Connection, spawn) -> None:
    import pgstreams

    s = pgstreams.create_stream()
    proc = spawn("exit", "--stream", str(s.id), "--count", "5", "--flush-interval", "3600")
    assert proc.wait(60) == 0, proc.stderr.read()
    marks = [m for n in received(listen, 2) for m in notify.decode(n.payload)]
    # The first write is flushed at once; the other four wait for the interval, then exit.
    assert marks == [Mark(s.id, 1, False), Mark(s.id, 5, False)]


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
