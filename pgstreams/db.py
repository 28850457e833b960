"""Connections of pgstreams' own (listener, fetcher, flusher, appender), made from a Django alias,
and the limits that keep a dead or silent peer from holding them: a connect timeout, TCP
keepalives and ``tcp_user_timeout``, and a deadline on every query (``deadline()`` in async
code; ``watched()`` for a blocking connection, enforced by a watchdog thread); and the bound on
how long a transaction that locks a stream's row may sit idle (``bound_idle()``), so that a
stopped or partitioned process holds no row for long.

The only module that turns ``settings.DATABASES`` into psycopg connection arguments. The write
path does not come here: it runs on Django's own connection, inside the caller's transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final

import psycopg
from django.db import connections

from . import conf
from .process import PerProcess

# Django's connection arguments that only make sense for Django's own cursors.
_DJANGO_ONLY = ("cursor_factory", "context")
_random = random.Random()  # its own: the global state a project may seed is left alone


def connect_kwargs(alias: str, role: str) -> dict[str, Any]:
    """psycopg.connect() arguments for ``alias``, in autocommit, named for pg_stat_activity.

    ``role`` ("listener", "fetcher", "flusher", "appender") goes into ``application_name`` with
    the pid, so an operator can see which process holds which backend.
    """
    wrapper = connections[alias]
    if wrapper.vendor != "postgresql":
        raise psycopg.NotSupportedError(f"pgstreams needs PostgreSQL; database {alias!r} is {wrapper.vendor}")
    params = wrapper.get_connection_params()
    for key in _DJANGO_ONLY:
        params.pop(key, None)
    params["application_name"] = f"pgstreams {role} {os.getpid()}"
    params["autocommit"] = True
    for key, value in liveness_params().items():
        params.setdefault(key, value)  # the alias's OPTIONS win
    return params


def liveness_params() -> dict[str, int]:
    """libpq parameters that bound how long a dead peer goes unnoticed, from the settings.

    A connection that cannot be opened within CONNECT_TIMEOUT fails. On TCP, data the peer does
    not acknowledge within QUERY_TIMEOUT breaks the connection (tcp_user_timeout), and an idle
    connection is probed after QUERY_TIMEOUT of silence, three times at a third of it apart
    (keepalives). libpq ignores the TCP ones on Unix sockets.
    """
    query_timeout = conf.query_timeout()
    return {
        "connect_timeout": conf.connect_timeout(),
        "keepalives": 1,
        "keepalives_idle": max(1, math.ceil(query_timeout)),
        "keepalives_interval": max(1, math.ceil(query_timeout / 3)),
        "keepalives_count": 3,
        "tcp_user_timeout": max(1, math.ceil(query_timeout * 1000)),
    }


def connect(alias: str, role: str) -> psycopg.Connection[Any]:
    return psycopg.Connection.connect(**connect_kwargs(alias, role))


async def aconnect(alias: str, role: str) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(**connect_kwargs(alias, role))


class Backoff:
    """Exponential delays with full jitter, for reconnect loops: 0.05 s doubling up to ``cap``."""

    def __init__(self, first: float = 0.05, cap: float = 2.0) -> None:
        self.first = first
        self.cap = cap
        self.attempt = 0

    def next(self) -> float:
        delay = min(self.cap, self.first * 2**self.attempt)
        self.attempt += 1
        return _random.uniform(delay / 2, delay)

    def reset(self) -> None:
        self.attempt = 0


def sever(conn: psycopg.AsyncConnection[Any]) -> None:
    """Shut a connection's socket down, so that whatever waits on it fails at once.

    Unlike a query cancel, this needs no answer from a server that may be gone: the next read
    sees the end of the stream and psycopg raises ``OperationalError``. The socket is shut down,
    not closed, so its descriptor stays valid for the code still waiting on it.
    """
    if conn.closed:
        return
    with contextlib.suppress(OSError, psycopg.Error), socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
        sock.shutdown(socket.SHUT_RDWR)


async def close_quietly(conn: psycopg.AsyncConnection[Any]) -> None:
    """Close a connection that may be broken already; nothing to report either way."""
    with contextlib.suppress(Exception):
        await conn.close()


def close_blocking_quietly(conn: psycopg.Connection[Any]) -> None:
    """``close_quietly()`` for a blocking connection (the flusher's, the appender's)."""
    with contextlib.suppress(Exception):
        conn.close()


class QueryTimeout(psycopg.OperationalError):
    """A query on one of pgstreams' connections had no answer within QUERY_TIMEOUT."""


@contextlib.asynccontextmanager
async def deadline(conn: psycopg.AsyncConnection[Any], what: str) -> AsyncIterator[None]:
    """Bound the queries of the block by QUERY_TIMEOUT: past it the connection is severed and
    the block raises ``QueryTimeout``; the caller drops the connection and opens another."""
    seconds = conf.query_timeout()
    fired = False

    def expire() -> None:
        nonlocal fired
        fired = True
        sever(conn)

    timer = asyncio.get_running_loop().call_later(seconds, expire)
    try:
        yield
    except psycopg.OperationalError as exc:
        if fired:
            raise QueryTimeout(f"{what}: no answer from the database within {seconds:g} s") from exc
        raise
    finally:
        timer.cancel()


class _Watch:
    """A watched query: a duplicate of its connection's socket, taken by the thread that runs
    the query (so the watchdog never reads the connection, nor a descriptor libpq may have
    closed and the process reused), and its deadline."""

    __slots__ = ("sock", "at", "fired")

    def __init__(self, conn: psycopg.Connection[Any], at: float) -> None:
        self.sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
        self.at, self.fired = at, False


class _Watchdog:
    """A named daemon thread that severs the blocking connections whose watched queries run past
    their deadline. It looks every ``TICK`` seconds, starts with the first watch, and ends after
    ``IDLE`` seconds without one (the next watch starts it again)."""

    TICK = 0.25
    IDLE = 5.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: set[_Watch] = set()
        self._thread: threading.Thread | None = None
        self._last = 0.0  # when the last watch began

    @contextlib.contextmanager
    def watched(self, conn: psycopg.Connection[Any], what: str) -> Iterator[None]:
        seconds = conf.query_timeout()
        self._last = time.monotonic()
        watch = _Watch(conn, self._last + seconds)
        with self._lock:
            self._watches.add(watch)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pgstreams-watchdog", daemon=True)
                self._thread.start()
        try:
            yield
        except psycopg.OperationalError as exc:
            if watch.fired:
                raise QueryTimeout(f"{what}: no answer from the database within {seconds:g} s") from exc
            raise
        finally:
            with self._lock:  # a connection is never severed after its watch ended
                self._watches.discard(watch)
            watch.sock.close()

    def _run(self) -> None:
        while True:
            time.sleep(self.TICK)
            now = time.monotonic()
            with self._lock:
                if not self._watches and now - self._last > self.IDLE:
                    self._thread = None
                    return
                for watch in self._watches:
                    if not watch.fired and now >= watch.at:
                        watch.fired = True
                        with contextlib.suppress(OSError):  # the connection may be gone already
                            watch.sock.shutdown(socket.SHUT_RDWR)


_watchdogs: PerProcess[_Watchdog] = PerProcess(_Watchdog, lambda _: None)  # its thread ends when idle


def watched(conn: psycopg.Connection[Any], what: str) -> contextlib.AbstractContextManager[None]:
    """``deadline()`` for a blocking connection: a query of the block still running after
    QUERY_TIMEOUT (give or take a quarter second) has its connection severed, and the block
    raises ``QueryTimeout``; the caller drops the connection and opens another."""
    return _watchdogs.get().watched(conn, what)


# Ends the session of a client that leaves its transaction idle longer than the value (for this
# transaction only: set_config's third argument, so a pooled connection keeps nothing of it).
_IDLE_BOUND_SQL: Final = "SELECT set_config('idle_in_transaction_session_timeout', %s, true)"


def idle_bound() -> float:
    """Seconds a transaction of pgstreams' that locks a stream's row may sit idle before Postgres
    ends its session: half of QUERY_TIMEOUT. A stopped or partitioned process thus holds a row no
    longer, and a writer that waits for that row (QUERY_TIMEOUT at most) gets it."""
    return conf.query_timeout() / 2


def begin_bounded_sql() -> str:
    """``BEGIN`` and the idle bound, as one simple query: no round trip more than BEGIN's (no
    parameter either: the value is the code's, not a user's)."""
    return "BEGIN; " + _IDLE_BOUND_SQL.replace("%s", f"'{_idle_ms()}'")


def bound_idle(alias: str, cursor: Any) -> None:
    """Set the idle bound for the rest of the transaction that ``transaction.atomic(alias)`` just
    opened; not in a caller's transaction (an atomic block around ours): that one is the
    caller's, and may sit idle as long as it likes."""
    if len(connections[alias].atomic_blocks) == 1:
        cursor.execute(_IDLE_BOUND_SQL, [_idle_ms()])


def _idle_ms() -> str:
    return f"{max(1, round(idle_bound() * 1000))}ms"
