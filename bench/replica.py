"""A primary and a synchronous streaming standby built from the embedded binaries (scratch.py), for
the replica tests and ``pgstreams_bench --replica``.

The primary names the standby in ``synchronous_standby_names``, so each ``synchronous_commit``
level really waits for what it promises.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import sql

from . import scratch

STANDBY_NAME = "pgstreams_standby"
PRIMARY_PORT, STANDBY_PORT = 5432, 5433  # they only name the socket files in the directory


class ReplicaPair(scratch.Scratch):
    """``with ReplicaPair() as pair:`` a running primary and standby, removed afterwards."""

    PREFIX = "pgstreams-replica-"
    data = ("standby", "primary")

    def __init__(self) -> None:
        super().__init__()
        self.primary_data = self.root / "primary"
        self.standby_data = self.root / "standby"

    def build(self) -> None:
        self.initdb(self.primary_data)
        self.configure(
            self.primary_data,
            port=PRIMARY_PORT,
            max_connections=300,
            max_wal_senders=4,
            wal_level="replica",
        )
        self.pg_ctl(self.primary_data, "start")
        self.run(
            "pg_basebackup",
            "-D",
            self.standby_data,
            "-h",
            self.root,
            "-p",
            str(PRIMARY_PORT),
            "-U",
            "postgres",
            "-X",
            "stream",
            "-R",  # writes primary_conninfo and standby.signal
            "--no-sync",
        )
        # cluster_name is the application_name the standby's WAL receiver connects with.
        self.configure(self.standby_data, port=STANDBY_PORT, cluster_name=STANDBY_NAME, hot_standby_feedback="on")
        self.pg_ctl(self.standby_data, "start")
        with self.connect("primary") as conn:
            conn.execute(sql.SQL("ALTER SYSTEM SET synchronous_standby_names = {}").format(sql.Literal(STANDBY_NAME)))
            conn.execute("SELECT pg_reload_conf()")
        self._wait_synchronous()

    def _wait_synchronous(self) -> None:
        with self.connect("primary") as conn:
            deadline = time.monotonic() + 30
            while True:  # bounded: until the standby streams as the synchronous one
                state = conn.execute(
                    "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s", [STANDBY_NAME]
                ).fetchone()
                if state and state[0] == "sync":
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the standby did not become synchronous within 30 s (state {state}); {self}")
                time.sleep(0.05)

    # -- using it ----------------------------------------------------------------------------

    def database(self, which: str) -> dict[str, Any]:
        """A ``settings.DATABASES`` entry for "primary" or "standby"."""
        return self.entry({"primary": PRIMARY_PORT, "standby": STANDBY_PORT}[which])

    def connect(self, which: str) -> psycopg.Connection[Any]:
        """An autocommit psycopg connection to "primary" or "standby"."""
        return self.connect_to({"primary": PRIMARY_PORT, "standby": STANDBY_PORT}[which])

    @contextlib.contextmanager
    def replay_paused(self) -> Iterator[None]:
        """The standby receives and flushes WAL but does not apply it (so ``remote_apply``
        commits wait and its readers see nothing new) until the block ends."""
        with self.connect("standby") as conn:
            conn.execute("SELECT pg_wal_replay_pause()")
            try:
                yield
            finally:
                conn.execute("SELECT pg_wal_replay_resume()")

    @contextlib.contextmanager
    def standby_stopped(self) -> Iterator[None]:
        """The standby is shut down (so commits at remote_write and above wait) until the block
        ends; then it is started again and streams as the synchronous standby."""
        self.pg_ctl(self.standby_data, "stop", "-m", "fast")
        try:
            yield
        finally:
            self.pg_ctl(self.standby_data, "start")
            self._wait_synchronous()


@contextlib.contextmanager
def installed(pair: ReplicaPair, prefix: str) -> Iterator[tuple[str, str]]:
    """Add the pair to ``settings.DATABASES`` as ``<prefix>_primary`` and ``<prefix>_standby``,
    migrate the primary, and remove both aliases afterwards. Yields the two aliases."""
    primary, standby = f"{prefix}_primary", f"{prefix}_standby"
    with scratch.installed({primary: pair.database("primary"), standby: pair.database("standby")}, migrate=primary):
        yield primary, standby
