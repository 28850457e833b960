"""pgstreams behind a real PgBouncer in transaction pooling mode (Debian's pgbouncer, started by
the test with one server connection per pool): no session state left on the pooled connection,
and a whole write -> read round trip, as the guide's PgBouncer section describes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.test import override_settings

import pgstreams
from bench.pgbouncer import pgbouncer_missing, running_pgbouncer
from pgstreams import notify
from tests.helpers import database_alias

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def bouncer() -> Iterator[tuple[str, dict[str, Any]]]:
    """A PgBouncer (transaction pooling, one server connection) in front of the test database,
    as alias ``bouncer``; yields (alias, its DATABASES entry)."""
    missing = pgbouncer_missing()
    if missing:
        pytest.skip(missing)
    with running_pgbouncer(connection.settings_dict, pool_size=1) as entry, database_alias("bouncer", entry):
        yield "bouncer", entry


def through(alias: str) -> Any:
    """pgstreams on ``alias`` for writes and fetches, as the guide says to run it behind PgBouncer
    before 1.21: LISTEN on a direct connection, no prepared statements."""
    return override_settings(PGSTREAMS={"DATABASE": alias, "LISTEN_DATABASE": "default", "PREPARED_STATEMENTS": False})


def pooled_setting(entry: dict[str, Any], name: str) -> str:
    """What another client of the pool sees of a setting (the pool has one server connection)."""
    with psycopg.connect(
        host=entry["HOST"],
        port=entry["PORT"],
        dbname=entry["NAME"],
        user=entry["USER"],
        autocommit=True,
        prepare_threshold=None,
    ) as conn:
        return conn.execute("SELECT current_setting(%s)", [name]).fetchone()[0]


def test_writes_and_flushes_leave_no_session_setting_on_a_pooled_connection(bouncer) -> None:
    alias, entry = bouncer
    before = pooled_setting(entry, "synchronous_commit")
    notify.stop_flusher()  # the next one connects through PgBouncer
    with through(alias):
        s = pgstreams.create_stream()
        pgstreams.write(s.id, "a", synchronous_commit="off")
        pgstreams.write_many(s.id, ["b", "c"], synchronous_commit="remote_apply")
        pgstreams.close(s.id)
        flusher = notify.flusher()
        deadline = time.monotonic() + 10
        while flusher.stats.flushes < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert flusher.stats.flushes >= 1 and flusher.stats.failed_flushes == 0
        after = pooled_setting(entry, "synchronous_commit")
    notify.stop_flusher()
    print(f"synchronous_commit seen by another client of the pool: {before!r} before, {after!r} after")
    assert after == before


@pytest.mark.usefixtures("fresh_listener")
def test_a_write_read_round_trip_through_pgbouncer(bouncer) -> None:
    alias, _ = bouncer
    notify.stop_flusher()
    with through(alias):
        s = pgstreams.create_stream()
        got: list[tuple[int, str]] = []
        reader = threading.Thread(
            target=lambda: got.extend((c.offset, c.data) for c in pgstreams.read(s.id, timeout=10))
        )
        reader.start()
        for i in range(50):
            pgstreams.write(s.id, f"t{i}")
        pgstreams.write_many(s.id, ["x", "y"])
        pgstreams.close(s.id)
        reader.join(20)
        assert not reader.is_alive()
    notify.stop_flusher()
    assert got == [(i, f"t{i}") for i in range(50)] + [(50, "x"), (51, "y")]
