"""Whether an append batch whose commit got no answer committed: asked of the database, on a
connection of the appender's, within a retry budget.

A batch committed if the first chunk it gave any of its streams is there with the batch's
transaction as its inserter (``xmin``), a fact no later transaction can fake, even one that
reuses the id after a crash; it did not if other transactions' chunks hold those places. If
none of them is there (every stream of the batch was deleted, pruned or expired since), or the
batch wrote no chunk (it only closed streams, or recorded producers' batches), the transaction's
own status tells. Before concluding, a transaction still in progress (its backend has not noticed
the lost client) is ended by ending its backend. Nothing here writes.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import psycopg.errors

from . import conf, db

logger = logging.getLogger("pgstreams.appender")

STATUS_SQL = "SELECT pg_xact_status(%s::xid8)"
# The inserters of the chunks at the places a batch gave its streams' first chunks: 32-bit
# transaction ids.
INSERTERS_SQL = (
    'SELECT xmin::text FROM pgstreams_chunk WHERE (stream_id, "offset") IN'
    " (SELECT * FROM unnest(%s::uuid[], %s::bigint[]))"
)
# Waits (up to the given milliseconds) for the backend to exit, so its transaction has ended.
TERMINATE_SQL = "SELECT pg_terminate_backend(%s, %s)"


def committed(
    connection: Callable[[], psycopg.Connection[Any]],
    dropped: Callable[[], None],
    xid: str,
    pid: int,
    places: list[tuple[uuid.UUID, int]],
    failure: Exception,
) -> bool | None:
    """True, False, or None if no connection could tell within CONNECT_TIMEOUT + QUERY_TIMEOUT.
    ``connection()`` gives the appender's connection (opening one if needed), ``dropped()``
    closes it after a failure; ``places`` are the batch's first chunk in each stream it wrote."""
    columns = [[sid for sid, _ in places], [offset for _, offset in places]]
    deadline = time.monotonic() + conf.connect_timeout() + conf.query_timeout()
    backoff = db.Backoff()
    while True:
        try:
            conn = connection()
            with db.watched(conn, "asking whether an append batch committed"):
                inserters = {int(x) for (x,) in conn.execute(INSERTERS_SQL, columns).fetchall()} if places else set()
                outcome: bool | None = None
                if int(xid) % 2**32 in inserters:
                    outcome = True
                elif (status := _status(conn, xid)) == "in progress":  # ask again, once it has ended
                    conn.execute(TERMINATE_SQL, [pid, int(conf.query_timeout() * 1000 / 2)])
                else:
                    outcome = not inserters and status == "committed"
            if outcome is not None:
                logger.warning(
                    "pgstreams: an append batch's commit got no answer (%s); it %s",
                    failure,
                    "committed" if outcome else "did not commit",
                )
                return outcome
        except psycopg.Error:
            dropped()
        if time.monotonic() >= deadline:
            return None
        time.sleep(backoff.next())


def _status(conn: psycopg.Connection[Any], xid: str) -> str | None:
    """Transaction ``xid``'s status: "in progress", "committed", "aborted", or None for one too old
    to tell or that the server has not reached (it restarted from a WAL that never saw it, or
    another server took over)."""
    try:
        row = conn.execute(STATUS_SQL, [xid]).fetchone()
    except psycopg.errors.InvalidParameterValue:
        return None
    return None if row is None else row[0]
