"""The notification queue's guard: ends the pgstreams listener sessions that pin it.

Postgres keeps one notification queue per cluster, and each listening session holds its place
in it until it has sent what it read to its client. A process that stops reading (stopped,
frozen, starved of the GIL) leaves its listener's session blocked writing to it, and the queue
grows behind that session until every NOTIFY of the cluster fails. So every process that
listens or flushes reads the queue's usage (the listener at each LISTEN check, the flusher with
each flush) and, past ``NOTIFY_QUEUE_GUARD``, ends the listener sessions that are blocked writing
to their client (``wait_event = 'ClientWrite'``) and have run no query for three of their own
``LISTEN_CHECK_INTERVAL``s (a live listener runs one at every interval, and says how often in a
comment of its queries). A listener that far behind is holding the queue too, stopped or not.
The process whose session was ended reconnects when it runs again and fetches what it follows,
so it loses nothing.

Ending another role's session takes that role, or ``pg_signal_backend`` and
``pg_read_all_stats``; without them the guard finds nothing (or is refused) and says so in the
log. It does not look at anything but pgstreams listener sessions, and it does not hold a
connection of its own: it runs on the connection that read the usage.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psycopg

from . import conf, metrics

logger = logging.getLogger("pgstreams.guard")

USAGE_SQL = "SELECT pg_notification_queue_usage()"
# Every statement a listener sends on its LISTEN connection ends with this comment, which
# pg_stat_activity.query shows: how often that listener runs one, whatever this process's
# LISTEN_CHECK_INTERVAL is. A session without it (another program, an older pgstreams) is never
# ended.
_EVERY = "/* pgstreams listener: a query every {interval:g} s */"
# The listener sessions blocked sending notifications that have run no query for STUCK_CHECKS of
# their own intervals, ended; each row says which it was.
END_STUCK_SQL = r"""
WITH listener AS (
    SELECT pid, application_name, client_addr, state_change,
           substring(
               query FROM '/\* pgstreams listener: a query every ([0-9]+(\.[0-9]+)?(e[+-][0-9]+)?) s \*/'
           )::float8 AS every
    FROM pg_stat_activity
    WHERE application_name LIKE 'pgstreams listener %%' AND wait_event = 'ClientWrite' AND pid <> pg_backend_pid()
)
SELECT pid, application_name, coalesce(host(client_addr), 'local'),
       extract(epoch FROM clock_timestamp() - state_change)::float8, pg_terminate_backend(pid)
FROM listener
WHERE every IS NOT NULL AND state_change < clock_timestamp() - make_interval(secs => %s * every)
"""
STUCK_CHECKS = 3  # a listener's own intervals without a query, in ClientWrite: stuck
QUIET_WARNINGS = 300.0  # seconds between two warnings that the queue is full of someone else's


class Guard:
    """This process's looks: at most one per LISTEN_CHECK_INTERVAL, whoever reads the usage."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next_look = 0.0
        self._next_warning = 0.0
        self._unexplained: tuple[float, float] | None = None  # (since, usage): looks found nothing stuck

    def due(self, usage: float) -> bool:
        """Note the queue's usage; whether to look for stuck listeners now."""
        metrics.notify_queue_usage.set(usage)
        limit = conf.notify_queue_guard()
        if limit is None or usage < limit:
            self._unexplained = None
            return False
        with self._lock:
            now = time.monotonic()
            if now < self._next_look:
                return False
            self._next_look = now + conf.listen_check_interval()
            return True

    def ended(self, usage: float, rows: list[tuple[Any, ...]]) -> None:
        for pid, name, host, quiet, done in rows:
            if not done:
                continue  # it ended meanwhile, perhaps at another process's look
            metrics.stuck_listeners_ended.inc()
            logger.warning(
                "pgstreams: ended the listener session %s (%r, from %s): blocked sending notifications, it had run no "
                "query for %.0f s while Postgres' notification queue was %.3g%% full. That process is not reading "
                "its connection (stopped, frozen or starved); it reconnects and catches up when it runs again.",
                pid,
                name,
                host,
                quiet,
                100 * usage,
            )
        if any(row[4] for row in rows):
            self._unexplained = None
            return
        now = time.monotonic()
        if self._unexplained is None:
            self._unexplained = (now, usage)
        elif now - self._unexplained[0] > 2 * _stuck_after() and usage > self._unexplained[1]:
            # Long enough for a stuck listener to show, and growing: not a small queue's usual lag.
            self._warn(
                "pgstreams: Postgres' notification queue is %.3g%% full and no pgstreams listener this role can see "
                "is stuck: another application's session may hold it (see pg_stat_activity), or a listener of "
                "another role (grant this role pg_read_all_stats and pg_signal_backend).",
                100 * usage,
            )

    def refused(self, usage: float, exc: Exception) -> None:
        self._warn(
            "pgstreams: could not end a stuck listener session while Postgres' notification queue is %.3g%% full: "
            "%s (grant this role pg_signal_backend, or connect every process as the same role).",
            100 * usage,
            exc,
        )

    def _warn(self, message: str, *args: Any) -> None:
        with self._lock:
            now = time.monotonic()
            if now < self._next_warning:
                return
            self._next_warning = now + QUIET_WARNINGS
        logger.warning(message, *args)


_guard = Guard()


def _stuck_after() -> float:
    return STUCK_CHECKS * conf.listen_check_interval()


def signed(statement: str) -> str:
    """``statement`` as this process's listener sends it: with the comment that tells the guards
    of other processes how often it runs one."""
    return f"{statement} {_EVERY.format(interval=conf.listen_check_interval())}"


due = _guard.due


def look(conn: psycopg.Connection[Any], usage: float) -> None:
    """End the stuck listeners (when ``due()``), on a blocking connection in autocommit."""
    try:
        rows = conn.execute(END_STUCK_SQL, (STUCK_CHECKS,)).fetchall()
    except psycopg.errors.InsufficientPrivilege as exc:
        _guard.refused(usage, exc)
        return
    _guard.ended(usage, rows)


async def alook(conn: psycopg.AsyncConnection[Any], usage: float) -> None:
    """``look()`` on an async connection."""
    try:
        rows = await (await conn.execute(END_STUCK_SQL, (STUCK_CHECKS,))).fetchall()
    except psycopg.errors.InsufficientPrivilege as exc:
        _guard.refused(usage, exc)
        return
    _guard.ended(usage, rows)
