"""The project's task workers: ``manage.py db_worker`` processes of django-tasks-db, each running
one task at a time, which write the generations (``pgstreams.generations``). ``manage.py demo``
keeps a ``Pool`` of two beside its server; the tests and the takeover benchmark start their own.
Not here:
what a task does (``chat/tasks.py``, ``bench/tasks.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # where manage.py is


def start_worker(
    worker_id: str,
    *,
    interval: float = 0.1,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
    max_tasks: int | None = None,
) -> subprocess.Popen[bytes]:
    """A ``db_worker`` named ``worker_id`` (as its tasks' results record it) that looks for a task
    every ``interval`` seconds, with this process's environment and ``env``, run from ``cwd``
    (the demo's root, or another project's), and exits after ``max_tasks`` tasks if given; its
    output is dropped."""
    command = [sys.executable, "manage.py", "db_worker", "--no-reload", "--no-startup-delay"]
    command += ["--interval", str(interval), "--worker-id", worker_id]
    if max_tasks is not None:
        command += ["--max-tasks", str(max_tasks)]
    return subprocess.Popen(
        command,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


class Pool:
    """``count`` workers kept running: a thread of this process ("demo-workers") replaces one that
    dies (killed, say), until ``stop()``, at most one start in 5 s in its place (a worker that
    cannot start would otherwise be started twice a second); not one that exits cleanly (as after
    Ctrl-C, whose SIGINT reaches the workers too). ``say`` is told of each start."""

    def __init__(self, count: int, prefix: str, say: Callable[[str], None]) -> None:
        self._prefix, self._say, self._made = prefix, say, 0
        self._started: dict[int, float] = {}  # by pid
        self._stopping = threading.Event()
        self.processes = [self._start() for _ in range(count)]
        self._thread = threading.Thread(target=self._keep, name="demo-workers", daemon=True)
        self._thread.start()

    def _start(self) -> subprocess.Popen[bytes]:
        self._made += 1
        process = start_worker(f"{self._prefix}-{self._made}")
        self._started[process.pid] = time.monotonic()
        self._say(f"model worker {self._prefix}-{self._made} started: pid {process.pid}")
        return process

    def _keep(self) -> None:
        while not self._stopping.wait(0.5):
            self.processes = [self._start() if self._died(p) else p for p in self.processes]

    def _died(self, process: subprocess.Popen[bytes]) -> bool:
        """Whether ``process`` died and may be replaced now."""
        return process.poll() not in (None, 0) and time.monotonic() - self._started[process.pid] >= 5

    def stop(self) -> None:
        """Stop replacing them, and stop them: SIGTERM (after Ctrl-C's SIGINT, a second signal,
        so a worker exits mid-task and the next run takes its answer over), SIGKILL after 10 s."""
        self._stopping.set()
        self._thread.join()
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
