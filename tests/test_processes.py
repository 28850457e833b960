"""Readers here, writers in other processes: exact delivery across processes, two faults (a
writer that dies before its flush, the listener's backend terminated under readers), and a reading
process that exits in the middle of its listener's query."""

from __future__ import annotations

import json
import os
import signal
import time

import psycopg
import pytest
from django.db import connection
from django.test import override_settings

import pgstreams
from pgstreams import listener
from tests.helpers import Reader, subprocess_database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess]


def test_a_reader_gets_exactly_what_16_writer_threads_in_another_process_committed(spawn) -> None:
    s = pgstreams.create_stream()
    readers = [Reader(s.id) for _ in range(2)]
    for r in readers:
        r.start()
    proc = spawn("threads", "--stream", str(s.id), "--threads", "16", "--per-thread", "40")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    committed = [tuple(pair) for pair in json.loads(out)]
    for r in readers:
        r.join(30)
        assert r.error is None and not r.is_alive()
        assert r.got == committed
    # Gap-free although some writes rolled back; each thread's writes in its own order.
    assert [o for o, _ in committed] == list(range(len(committed)))
    assert len(committed) == 16 * 40 - 16 * len([i for i in range(40) if i % 7 == 3])
    for t in range(16):
        mine = [int(d.split("-")[1]) for _, d in committed if d.startswith(f"t{t}-")]
        assert mine == sorted(mine)


@pytest.mark.faults
@pytest.mark.usefixtures("fresh_listener")
@pytest.mark.parametrize("death", ["SIGKILL", "os._exit"])
def test_a_writer_that_dies_before_its_flush_is_caught_up_by_polling(spawn, death: str) -> None:
    # os._exit() is how the children of gunicorn and of Celery's prefork pool leave: no atexit
    # handler runs, so no final flush.
    poll = 0.5
    with override_settings(PGSTREAMS={"POLL_INTERVAL": poll}):
        s = pgstreams.create_stream()
        reader = Reader(s.id, limit=20)
        reader.start()
        hub = listener.get_listener()
        how = ["--os-exit"] if death == "os._exit" else []
        proc = spawn("hang", "--stream", str(s.id), "--count", "20", "--setting", "FLUSH_INTERVAL=3600", *how)
        assert proc.stdout.readline().strip() == "first"
        _wait_for(lambda: len(reader.got) == 1)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "written"
        if death == "SIGKILL":
            os.kill(proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        proc.wait(10)
        reader.join(poll * 1.2 + 5)
    assert reader.error is None
    assert reader.got == [(i, f"c{i}") for i in range(20)]
    # Only c0 was notified; c1 to c19 were committed after the reader had c0, and came by the poll.
    assert hub.stats.poll_found >= 1
    catch_up = max(0.0, reader.last_at - killed_at)
    assert catch_up <= poll * 1.2 + 1.0, f"caught up in {catch_up:.2f} s"
    print(f"caught up {catch_up * 1000:.0f} ms after {death} (POLL_INTERVAL {poll} s)")


def _listener_backend() -> int | None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
            [f"pgstreams listener {os.getpid()}"],
        )
        row = cursor.fetchone()
    return row[0] if row else None


def _wait_for(predicate, timeout: float = 10.0) -> float:
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, "timed out"
        time.sleep(0.005)
    return time.monotonic() - started


@pytest.mark.faults
@pytest.mark.usefixtures("fresh_listener")
def test_terminating_the_listeners_backend_ten_times_loses_no_chunk(spawn) -> None:
    s = pgstreams.create_stream()
    readers = [Reader(s.id) for _ in range(3)]
    for r in readers:
        r.start()
    hub = listener.get_listener()
    _wait_for(hub.listening.is_set)
    proc = spawn("steady", "--stream", str(s.id), "--count", "800", "--pause", "0.004")
    reconnect_times = []
    for _ in range(10):
        old = _listener_backend()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [old])
        reconnect_times.append(_wait_for(lambda old=old: _listener_backend() not in (None, old)))
        time.sleep(0.1)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    for r in readers:
        r.join(30)
        assert r.error is None
        assert r.got == [(i, f"s{i}") for i in range(800)]
    assert hub.stats.reconnects >= 10
    assert max(reconnect_times) < 5
    print(f"listener reconnect times: {', '.join(f'{t * 1000:.0f} ms' for t in reconnect_times)}")


def test_a_process_that_exits_while_its_listener_waits_for_a_query_exits_quietly(spawn) -> None:
    """At exit the listener severs its connections: a query in flight then fails at once, and is
    not cancelled on the server by psycopg (which needs a thread the exiting interpreter refuses,
    and printed "query cancellation failed: cannot schedule new futures after interpreter
    shutdown")."""
    s = pgstreams.create_stream()
    url = subprocess_database_url()
    with psycopg.connect(url) as locker, psycopg.connect(url, autocommit=True) as watcher:
        locker.execute("LOCK TABLE pgstreams_chunk IN ACCESS EXCLUSIVE MODE")  # until the block ends
        proc = spawn("read-exit", "--stream", str(s.id))
        assert proc.stdout.readline() == "reading\n"
        waiting = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'"
        for _ in range(300):  # the fetcher's first query waits for the lock
            if watcher.execute(waiting, [f"pgstreams fetcher {proc.pid}"]).fetchone()[0]:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the reading process's fetcher never waited for the lock")
        out, err = proc.communicate("exit\n", timeout=30)
    print(f"exited with {proc.returncode}; stderr: {err!r}")
    assert proc.returncode == 0 and err == ""
