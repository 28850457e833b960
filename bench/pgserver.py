"""The Postgres server that the fault tests run against, as something they may stop and start:
the embedded PostgreSQL 18 in ``.pgdata/`` or Debian's PostgreSQL 15 cluster, recognised by the
data directory the server reports (whatever URL reached it); and ``connect()``, a psycopg
connection for a Django DATABASES entry.

``ServerControl`` stops and starts that server (``why_not`` says why it cannot, for any other
server). It does not touch the server's configuration. (The soak runs on servers of its own:
``bench.soak.servers``.)
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import psycopg

from demo_project.database import PGDATA
from demo_project.database import pg_ctl as embedded_pg_ctl

DEBIAN_DATA = "/var/lib/postgresql/{major}/main"


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
        pgdata = PGDATA.resolve()
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
