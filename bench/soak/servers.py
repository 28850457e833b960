"""The soak's two PostgreSQL servers, built from the embedded binaries in a directory of their own
(``scratch``): a primary and a hot standby streaming from it, and what the faults do to them:
restart the primary, pause the standby's replay, and switch the two over (the primary stopped,
the standby promoted, the old primary started again as the new one's standby).

Clients find the primary wherever it is, as libpq's own failover does: ``entry()`` lists both
servers with ``target_session_attrs=read-write`` (a connection goes to whichever accepts
writes), ``standby_entry()`` with ``prefer-standby``. What must be pointed at one server (the
freezing proxy, PgBouncer) is pointed again by the coordinator after a switchover, as an
operator's failover tooling would: ``primary_entry()``, ``primary_socket()``.

A switchover loses nothing committed: the standby is promoted only once it has received the old
primary's last WAL record (the checkpoint its shutdown wrote). It does not simulate a primary
that vanishes with commits its standby never saw (then committed chunks are lost, which no
client can prevent), nor a failover without a standby left to switch back to.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

from bench import scratch

PORTS = {"a": 5441, "b": 5442}  # they only name the socket files in the directory
RECEIVE_TIMEOUT = 30.0  # seconds the standby has to receive the stopped primary's last record


class ServerPair(scratch.Scratch):
    """``with ServerPair() as servers:`` server "a", the primary, and "b", its standby, running;
    removed afterwards (``close(keep=True)`` stops them and leaves their directory)."""

    PREFIX = "pgstreams-soak-servers-"
    data = ("a", "b")

    def __init__(self) -> None:
        super().__init__()
        self.primary, self.standby = "a", "b"

    def build(self) -> None:
        a, b = self.root / "a", self.root / "b"
        self.initdb(a)
        # wal_keep_size: the standby stays within reach of the primary's WAL while it is paused,
        # restarted or switched over, without a replication slot that would outlive a switchover.
        # wal_retrieve_retry_interval: a standby whose primary restarted streams again within
        # a fraction of a second, not 5 s.
        self.configure(
            a,
            port=PORTS["a"],
            max_connections=200,
            wal_keep_size="1GB",
            hot_standby_feedback="on",
            wal_retrieve_retry_interval="100ms",
        )
        self.pg_ctl(a, "start")
        self.run(
            "pg_basebackup",
            *("-D", b, "-h", self.root, "-p", PORTS["a"], "-U", "postgres"),
            *("-X", "stream", "-R", "--no-sync", "--checkpoint=fast"),
        )
        self.configure(b, port=PORTS["b"])
        self.pg_ctl(b, "start")
        self._wait_streaming()

    def close(self, keep: bool = False) -> None:
        """Stop both servers; remove their directory, or with ``keep`` leave it (stopped, no
        longer owned: no later run removes it) and say where."""
        if not keep:
            self.stop()
            return
        for name in self.data:
            if (self.root / name / "postmaster.pid").exists():
                with contextlib.suppress(RuntimeError):
                    self.pg_ctl(self.root / name, "stop", "-m", "fast")
        (self.root / "owner.pid").unlink(missing_ok=True)

    # -- where clients connect -------------------------------------------------------------------

    def database(self, name: str) -> dict[str, Any]:
        """The DATABASES entry of database ``name`` on whichever server is the primary."""
        return self._both(name, "read-write")

    def standby_database(self, name: str) -> dict[str, Any]:
        """The entry of database ``name`` on the standby, or on the primary while there is none."""
        return self._both(name, "prefer-standby")

    def primary_database(self, name: str) -> dict[str, Any]:
        """The entry of database ``name`` on the server that is the primary now, that one only."""
        return {**self.entry(PORTS[self.primary]), "NAME": name}

    def primary_socket(self) -> str:
        return f"{self.root}/.s.PGSQL.{PORTS[self.primary]}"

    def _both(self, name: str, attrs: str) -> dict[str, Any]:
        return {
            **self.entry(PORTS["a"]),
            "NAME": name,
            "HOST": f"{self.root},{self.root}",
            "PORT": f"{PORTS['a']},{PORTS['b']}",
            "OPTIONS": {"target_session_attrs": attrs},
        }

    # -- the faults --------------------------------------------------------------------------------

    def restart_primary(self, down: float) -> None:
        """Stop the primary (fast: its sessions are ended), wait ``down`` seconds, start it."""
        data = self.root / self.primary
        self.pg_ctl(data, "stop", "-m", "fast")
        time.sleep(down)
        self.pg_ctl(data, "start")

    @contextlib.contextmanager
    def replay_paused(self) -> Iterator[None]:
        """The standby receives WAL but applies none of it (its readers see nothing new) until
        the block ends."""
        with self.connect_to(PORTS[self.standby]) as conn:
            conn.execute("SELECT pg_wal_replay_pause()")
            try:
                yield
            finally:
                conn.execute("SELECT pg_wal_replay_resume()")

    def switchover(self, moved: Callable[[], None] = lambda: None) -> float:
        """Once the standby streams, stop the primary (fast), promote the standby once it has
        received all the primary wrote, call ``moved`` (the new primary is ``primary`` then), and start the old primary
        as the new one's standby; return the seconds during which no server accepted writes. If
        the standby does not catch up, the old primary is started again as it was and
        RuntimeError says so."""
        old, new = self.primary, self.standby
        self._wait_streaming()  # a standby not streaming at the stop would never get the last record
        began = time.monotonic()
        self.pg_ctl(self.root / old, "stop", "-m", "fast")
        last = self._last_checkpoint(old)
        deadline = time.monotonic() + RECEIVE_TIMEOUT
        with self.connect_to(PORTS[new]) as conn:
            past = "SELECT coalesce(pg_last_wal_receive_lsn() > %s::pg_lsn, false)"
            while not conn.execute(past, [last]).fetchone()[0]:
                if time.monotonic() > deadline:
                    self.pg_ctl(self.root / old, "start")
                    raise RuntimeError(f"the standby did not receive WAL past {last} in {RECEIVE_TIMEOUT:.0f} s")
                time.sleep(0.02)
        self.pg_ctl(self.root / new, "promote")
        writable = time.monotonic() - began
        self.primary, self.standby = new, old
        moved()
        (self.root / old / "standby.signal").touch()
        if self.user is not None:
            shutil.chown(self.root / old / "standby.signal", self.user, self.user)
        self.configure(self.root / old, primary_conninfo=f"host={self.root} port={PORTS[new]} user=postgres")
        self.pg_ctl(self.root / old, "start")
        self._wait_streaming()
        return writable

    # -- helpers ---------------------------------------------------------------------------------

    def _last_checkpoint(self, server: str) -> str:
        """The location of the last checkpoint in a stopped server's control file."""
        control = self.run("pg_controldata", "-D", self.root / server)
        for line in control.splitlines():
            if line.startswith("Latest checkpoint location:"):
                return line.split(":", 1)[1].strip()
        raise RuntimeError(f"pg_controldata gave no checkpoint location:\n{control}")

    def _wait_streaming(self) -> None:
        """Until the primary streams to the standby (at most a minute)."""
        deadline = time.monotonic() + 60
        with self.connect_to(PORTS[self.primary]) as conn:
            while not conn.execute("SELECT 1 FROM pg_stat_replication WHERE state = 'streaming'").fetchone():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the standby did not stream within 60 s; {self}")
                time.sleep(0.05)

    def connect_primary(self) -> psycopg.Connection[Any]:
        return self.connect_to(PORTS[self.primary])
