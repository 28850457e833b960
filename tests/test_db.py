"""pgstreams' own connections: the limits that keep a dead peer from holding them (libpq's
connect timeout, keepalives and tcp_user_timeout; a deadline per query; the listener's check of
a silent LISTEN connection). The fault suite freezes real connections (test_faults.py)."""

from __future__ import annotations

import time

import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.test import override_settings

from pgstreams import db, listener
from tests.helpers import database_alias

pytestmark = pytest.mark.django_db(transaction=True)


def conninfo(conn: psycopg.Connection | psycopg.AsyncConnection) -> dict[str, str]:
    return {o.keyword.decode(): (o.val or b"").decode() for o in conn.pgconn.info}


def test_own_connections_carry_the_liveness_limits_and_the_alias_options_win() -> None:
    with override_settings(PGSTREAMS={"CONNECT_TIMEOUT": 3, "QUERY_TIMEOUT": 6}):
        with db.connect("default", "test") as conn:
            info = conninfo(conn)
    assert info["connect_timeout"] == "3" and info["tcp_user_timeout"] == "6000"
    assert (info["keepalives"], info["keepalives_idle"], info["keepalives_interval"], info["keepalives_count"]) == (
        "1",
        "6",
        "2",
        "3",
    )
    options = {**connection.settings_dict["OPTIONS"], "keepalives_idle": 60}
    with database_alias("tuned", {**connection.settings_dict, "OPTIONS": options}):
        assert db.connect_kwargs("tuned", "test")["keepalives_idle"] == 60


async def test_a_query_past_the_deadline_is_cut_off_without_waiting_for_the_server() -> None:
    with override_settings(PGSTREAMS={"QUERY_TIMEOUT": 0.3}):
        conn = await db.aconnect("default", "test")
        backend = conn.info.backend_pid
        started = time.monotonic()
        with pytest.raises(db.QueryTimeout, match="within 0.3 s"):
            async with db.deadline(conn, "sleeping"):
                await conn.execute("SELECT pg_sleep(30)")
        took = time.monotonic() - started
        await conn.close()
    assert took < 10  # not the 30 s of the query
    await sync_to_async(end_backend)(backend)


def test_a_blocking_query_past_the_deadline_is_cut_off_by_the_watchdog() -> None:
    with override_settings(PGSTREAMS={"QUERY_TIMEOUT": 0.3}):
        with db.connect("default", "test") as conn:
            backend = conn.info.backend_pid
            started = time.monotonic()
            with pytest.raises(db.QueryTimeout, match="within 0.3 s"), db.watched(conn, "sleeping"):
                conn.execute("SELECT pg_sleep(30)")
            took = time.monotonic() - started
            with pytest.raises(psycopg.OperationalError), db.watched(conn, "after"):
                conn.execute("SELECT 1")  # severed: the caller opens another
    assert took < 10  # not the 30 s of the query
    end_backend(backend)


def end_backend(pid: int) -> None:
    """End the backend still sleeping for a connection the client cut off (the server goes on
    with a query until it next talks to its client), so that it outlives no test."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])


@pytest.mark.usefixtures("fresh_listener")
def test_a_silent_listen_connection_is_checked_every_interval() -> None:
    with override_settings(PGSTREAMS={"LISTEN_CHECK_INTERVAL": 0.2}):
        hub = listener.get_listener()
        assert hub.listening.wait(10)
        time.sleep(1.5)
        checks = hub.stats.listen_checks
    assert 2 <= checks <= 8 and hub.stats.listen_errors == 0
