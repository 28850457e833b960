"""What the soak's processes write down, and the streams they may use.

Every process appends JSON lines to a file of its own in the run's ``log/`` directory, each
written through to the kernel as it happens: a process killed with SIGKILL leaves everything it
did until then. A writer notes each attempt before it makes it (``try``) and its outcome after
(``ok``, ``err``, ``rolledback``); a reader notes each session (``start``), the chunks it got
(``chunks``) and how it ended (``end``). ``check`` reads them all.

Every chunk's data is a JSON string naming the process, incarnation, kind and a counter, unique
in the run: the table tells who wrote each chunk, and a chunk stored twice is seen.

Streams are found in the database: those labelled ``LABEL`` are the soak's. The coordinator makes
and closes them; the others only read the list (``Streams``).
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LABEL = "pgstreams soak"
CONTENT_TYPE = "application/json"
PHASE_FILE = "phase"  # "run" while writing, "settle" once writers must stop
# Generations: written by the db_worker processes' tasks, plain text ("0 " ... "<n-1> ", "end")
# or AI SDK answers (n words), their paths ending with "count/<n>" or "answer/<n>". Labelled
# apart: no other writer or reader meets them, and the check reads them on their own.
GENERATION_LABEL = "pgstreams soak generation"
GENERATIONS_PREFIX = "soak-generation/"
GENERATION_CHUNKS = (10, 60)
TOKEN_DELAY = 0.05  # seconds between two chunks of an answer, a model's pace
GENERATION_LEASE = 2.0  # seconds: a worker stopped longer than this is taken over, then fenced
GENERATION_QUEUE = 30.0  # seconds an attempt may wait for a worker
GENERATION_ATTEMPTS = 1000  # never the last: every answer must end whole
GAVE_UP = "gave up"
DJANGO_CONNECTIONS = "soak django"  # the application_name of the processes' Django connections, and a pid
LIST_SQL = (
    "SELECT id, path, next_offset, closed_at IS NOT NULL FROM pgstreams_stream"
    " WHERE label = %s AND deleted_at IS NULL ORDER BY created_at DESC LIMIT 48"
)


class Log:
    """One process's record: thread-safe JSON lines, each written through as it happens, with
    its wall-clock time (``t``) for whoever reads the record beside the servers' logs."""

    def __init__(self, run_dir: Path, name: str) -> None:
        (run_dir / "log").mkdir(parents=True, exist_ok=True)
        self._file = open(run_dir / "log" / f"{name}.jsonl", "a", buffering=1)  # noqa: SIM115
        self._lock = threading.Lock()

    def __call__(self, **event: Any) -> None:
        line = json.dumps({**event, "t": round(time.time(), 3)}, separators=(",", ":")) + "\n"
        with self._lock:
            self._file.write(line)  # line-buffered: in the kernel before this returns


@dataclass(frozen=True)
class Known:
    """A stream as a worker last saw it."""

    id: uuid.UUID
    path: str
    next_offset: int
    closed: bool


class Streams:
    """The soak's streams, read from the database at most every ``every`` seconds."""

    def __init__(self, rng: random.Random, every: float = 0.5) -> None:
        self.rng = rng
        self.every = every
        self._known: list[Known] = []
        self._at = 0.0
        self._lock = threading.Lock()

    def refresh(self, rows: list[tuple[Any, ...]]) -> None:
        with self._lock:
            self._known = [Known(uuid.UUID(str(i)), p, n, c) for i, p, n, c in rows]
            self._at = time.monotonic()

    def stale(self) -> bool:
        return time.monotonic() - self._at >= self.every

    def refresh_sync(self, alias: str = "default") -> None:
        """Read the list through Django's connection of this thread (errors are the caller's)."""
        from django.db import connections

        with connections[alias].cursor() as cursor:
            cursor.execute(LIST_SQL, [LABEL])
            self.refresh(cursor.fetchall())

    def open(self) -> list[Known]:
        with self._lock:
            return [k for k in self._known if not k.closed]

    def pick_open(self) -> Known | None:
        streams = self.open()
        return self.rng.choice(streams) if streams else None

    def pick_any(self) -> Known | None:
        """Mostly an open stream; now and then one already closed (perhaps about to be pruned)."""
        with self._lock:
            known = list(self._known)
        open_ = [k for k in known if not k.closed]
        if open_ and (self.rng.random() < 0.8 or len(open_) == len(known)):
            return self.rng.choice(open_)
        return self.rng.choice(known) if known else None

    def start_offset(self, stream: Known) -> int:
        """Where a reader starts: the beginning, a random offset, or the tail."""
        roll = self.rng.random()
        if roll < 0.5 or stream.next_offset == 0:
            return 0
        if roll < 0.8:
            return self.rng.randrange(stream.next_offset + 1)
        return stream.next_offset


class Tags:
    """Unique chunk data for one process: ``"<name>.<kind><n>"`` as a JSON string."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._n = 0
        self._lock = threading.Lock()

    def __call__(self, kind: str) -> str:
        with self._lock:
            self._n += 1
            return json.dumps(f"{self.name}.{kind}{self._n}")


@dataclass(frozen=True)
class Worker:
    """Who this process is, from its command line: role, slot and incarnation (how many times
    its slot was started before), and the run's directory and seed."""

    role: str
    slot: int
    incarnation: int
    run_dir: Path
    seed: int

    @property
    def name(self) -> str:
        return f"{self.role}{self.slot}-{self.incarnation}"

    def rng(self, part: str = "") -> random.Random:
        return random.Random(f"{self.seed}/{self.name}/{part}")

    def settling(self) -> bool:
        try:
            return (self.run_dir / PHASE_FILE).read_text().strip() == "settle"
        except OSError:
            return False

    def config(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "config.json").read_text())


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
