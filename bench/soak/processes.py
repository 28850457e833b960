"""The soak's processes: what runs (``Layout``), each slot's incarnations (``Slot``), and the
supervisor that starts a killed process again when its moment comes and notes one that crashed.

Every process runs on this machine against the soak's database: two daphne processes of the demo
project (Durable Streams endpoint open to anyone), writer, reader and client processes
(``python -m bench.soak.worker``). The first writer and reader go to the database's own
connections of pgstreams through the freezing proxy; the second reader reads from the standby
(from the primary while there is none). Each process's output goes to ``proc/<name>-<incarnation>.err``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parent.parent.parent
WRITERS, READERS, CLIENTS, DAPHNES, TASK_WORKERS = 2, 2, 1, 2, 2
QUERY_TIMEOUT = 2.0
# The settings of every soak process: failures noticed within seconds, polls often.
# NOTIFY_QUEUE_GUARD: 80 KB of Postgres' default 8 GB queue, which a stopped reader's listener
# pins within seconds: the guard must end its session (the stop-reader fault says when it did).
PGSTREAMS = {
    "QUERY_TIMEOUT": QUERY_TIMEOUT,
    "LISTEN_CHECK_INTERVAL": 2.0,
    "POLL_INTERVAL": 0.5,
    "CONNECT_TIMEOUT": 2,
    "NOTIFY_QUEUE_GUARD": 0.00001,
}
CRASH_PAUSE = 1.0  # seconds before a crashed process starts again


def url(entry: dict[str, Any]) -> str:
    """A libpq connection string for a DATABASES entry (its OPTIONS too)."""
    return make_conninfo(
        dbname=entry["NAME"],
        user=entry.get("USER") or None,
        password=entry.get("PASSWORD") or None,
        host=entry.get("HOST") or None,
        port=str(entry.get("PORT") or "") or None,
        **(entry.get("OPTIONS") or {}),
    )


class Slot:
    """A worker or server process and its incarnations."""

    def __init__(self, role: str, index: int, command: Callable[[int], list[str]], env: dict[str, str], logs: Path):
        self.role, self.index, self.command, self.env, self.logs = role, index, command, env, logs
        self.incarnation = -1
        self.proc: subprocess.Popen[bytes] | None = None
        self.restart_at: float | None = None  # when a killed process starts again
        self.finished = False
        self.lock = threading.Lock()

    @property
    def name(self) -> str:
        return f"{self.role}{self.index}"

    def start(self) -> None:
        self.incarnation += 1
        err = open(self.logs / f"{self.name}-{self.incarnation}.err", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(self.command(self.incarnation), cwd=ROOT, env=self.env, stdout=err, stderr=err)
        err.close()
        self.restart_at = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, restart_in: float) -> None:
        with self.lock:
            if self.alive():
                self.restart_at = time.monotonic() + restart_in
                self.proc.kill()

    def pause(self) -> subprocess.Popen[bytes] | None:
        """SIGSTOP the process (a paused VM, a process starved of CPU); it, or None if none was
        running. ``resume`` it."""
        with self.lock:
            if not self.alive():
                return None
            assert self.proc is not None
            self.proc.send_signal(signal.SIGSTOP)
            return self.proc

    def resume(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGCONT what ``pause`` stopped, unless it was killed meanwhile (left to its restart)."""
        with self.lock:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)

    def stderr_tail(self, size: int = 1500) -> str:
        path = self.logs / f"{self.name}-{self.incarnation}.err"
        return path.read_text(errors="replace")[-size:] if path.exists() else ""


class Processes:
    """Every slot of a run, and the supervisor thread that keeps them running."""

    def __init__(self, slots: list[Slot], settling: Callable[[], bool]) -> None:
        self.slots = slots
        self.settling = settling
        self.crashes: list[str] = []
        self.lost_database: list[str] = []  # task workers that exited as their database went away
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="soak-supervisor", daemon=True)

    def start(self) -> None:
        for slot in self.slots:
            slot.start()
        self._thread.start()

    def of(self, *roles: str) -> list[Slot]:
        return [slot for slot in self.slots if slot.role in roles]

    def _supervise(self) -> None:
        """Start again what was killed, once its moment comes; note and restart what crashed.
        A worker that leaves with 0 while the run settles has finished."""
        while not self._stop.wait(0.1):
            for slot in self.slots:
                with slot.lock:
                    if slot.finished or slot.alive() or slot.proc is None:
                        continue
                    if slot.restart_at is None:  # it left by itself
                        code = slot.proc.returncode
                        if code == 0 and self.settling() and slot.role != "daphne":
                            slot.finished = True
                            continue
                        ended = f"{slot.name}-{slot.incarnation} exited {code}: {slot.stderr_tail()}"
                        (self.lost_database if _lost_database(slot) else self.crashes).append(ended)
                        slot.restart_at = time.monotonic() + CRASH_PAUSE
                    if time.monotonic() >= slot.restart_at:
                        slot.start()

    def stop(self) -> None:
        """Stop supervising, then end every process (SIGTERM, SIGKILL 10 s later)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        for slot in self.slots:
            if slot.alive():
                slot.proc.send_signal(signal.SIGTERM)
        for slot in self.slots:
            if slot.proc is not None:
                try:
                    slot.proc.wait(10)
                except subprocess.TimeoutExpired:
                    slot.proc.kill()
                    slot.proc.wait(10)


# The exceptions a task worker exits on when its database goes away.
LOST_DATABASE = ("django.db.utils.OperationalError", "django.db.utils.InterfaceError", "psycopg.OperationalError")


def _lost_database(slot: Slot) -> bool:
    """Whether ``slot`` is a task worker that exited on an error of its database connection:
    django-tasks-db's ``db_worker`` does when it cannot record a task's outcome (the server
    restarting, say), and a deployment's supervisor starts it again, as the soak's does."""
    return slot.role == "worker" and raised(slot.stderr_tail(20_000)).startswith(LOST_DATABASE)


def raised(stderr: str) -> str:
    """The line naming the exception a Python process's last traceback in ``stderr`` ends with
    ("" if there is none); the message's further lines, which libpq's errors have, follow it, and
    what the process's other threads logged meanwhile may come before it."""
    _, traceback, last = stderr.rpartition("Traceback (most recent call last):")
    return next((line for line in last.splitlines() if _EXCEPTION.match(line)), "") if traceback else ""


_EXCEPTION = re.compile(r"(?:[a-z_]\w*\.)*[A-Z]\w*(?::|\Z)")  # "psycopg.OperationalError: ...", "KeyError"


def _environment(entry: dict[str, Any]) -> dict[str, str]:
    """The environment of a soak process whose database is ``entry``."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.soak.settings",
        "DATABASE_URL": url(entry),
        "DEMO_OPEN_DURABLE_STREAMS": "1",
        "PYTHONUNBUFFERED": "1",
    }


def layout(
    run_dir: Path,
    seed: int,
    entry: dict[str, Any],
    via: dict[str, Any],
    standby: dict[str, Any],
    bouncer: dict[str, Any] | None,
    shards: int,
    ports: list[int],
) -> list[Slot]:
    """The slots of a run: daphne on ``ports``, then writers, readers, clients, the task
    workers and the AI SDK reader (where node is); ``via`` is the database entry through the
    freezing proxy, ``standby`` the standby's, ``bouncer`` PgBouncer's (or None), which the
    second daphne writes and reads through, as the PgBouncer how-to says (LISTEN on a direct
    connection, nothing prepared); every process notifies and listens on ``shards`` channels."""
    base = _environment(entry)

    def env(pgstreams: dict[str, Any], databases: dict[str, str]) -> dict[str, str]:
        return {
            **base,
            "SOAK_PGSTREAMS": json.dumps({**PGSTREAMS, "NOTIFY_SHARDS": shards, **pgstreams}),
            "SOAK_DATABASES": json.dumps(databases),
        }

    def worker(module: str, index: int) -> Callable[[int], list[str]]:
        return lambda inc: [
            sys.executable,
            "-m",
            "bench.soak.worker",
            module,
            str(index),
            str(inc),
            str(run_dir),
            str(seed),
        ]

    proxied = env({"DATABASE": "via"}, {"via": url(via)})
    plain = env({}, {})
    on_standby = env({"READ_DATABASE": "standby"}, {"standby": url(standby)})
    logs = run_dir / "proc"
    slots = []
    pooled = plain
    if bouncer is not None:
        pooled = env(
            {"DATABASE": "bouncer", "LISTEN_DATABASE": "default", "PREPARED_STATEMENTS": False},
            {"bouncer": url(bouncer)},
        )
    for i, port in enumerate(ports):
        command = [sys.executable, "-m", "daphne", "-v", "0", "-b", "127.0.0.1", "-p", str(port)]
        server = [*command, "demo_project.asgi:application"]
        slots.append(Slot("daphne", i, lambda _, c=server: c, pooled if i == 1 else plain, logs))
    slots += [Slot("writer", i, worker("writers", i), proxied if i == 0 else plain, logs) for i in range(WRITERS)]
    slots += [Slot("reader", i, worker("readers", i), proxied if i == 0 else on_standby, logs) for i in range(READERS)]
    slots += [Slot("clients", i, worker("clients", i), plain, logs) for i in range(CLIENTS)]
    slots += [Slot("worker", i, task_worker(i), plain, logs) for i in range(TASK_WORKERS)]
    if not no_aisdk_reader():
        slots.append(Slot("aisdk", 0, aisdk_reader(run_dir), plain, logs))
    return slots


def no_aisdk_reader() -> str:
    """Why this machine runs no AI SDK reader ("" if it does): it needs node and the pinned npm
    packages (``npm ci`` in ``node/``)."""
    if shutil.which("node") is None:
        return "node is not installed"
    if not (ROOT / "node" / "node_modules" / "ai").is_dir():
        return "the npm packages are not installed (npm ci in node/)"
    return ""


def aisdk_reader(run_dir: Path) -> Callable[[int], list[str]]:
    """The AI SDK reader (``node/soak_aisdk.mjs``), reading every AI SDK answer the run starts."""
    script = str(ROOT / "node" / "soak_aisdk.mjs")
    return lambda inc: ["node", script, json.dumps({"runDir": str(run_dir), "name": f"aisdk0-{inc}"})]


def task_worker(index: int) -> Callable[[int], list[str]]:
    """A ``db_worker`` running the generations' tasks, named by its slot and incarnation."""
    return lambda inc: [
        sys.executable,
        *("manage.py", "db_worker", "--no-reload", "--no-startup-delay", "--interval", "0.05"),
        *("--worker-id", f"soak-worker{index}-{inc}"),
    ]
