"""The counts the listener and the flusher keep, named once: the fields of ``ListenerStats`` and
``FlusherStats`` and ``AppenderStats``. Metrics, the benchmark and the tests read these fields, so a misspelt name is
an ``AttributeError``, never a silent zero. Plain integers: incremented without a lock, as a
``Counter`` was, they are figures for operators, not for correctness."""

from __future__ import annotations

import dataclasses
from typing import Any, Self


@dataclasses.dataclass(slots=True)
class _Stats:
    def snapshot(self) -> Self:
        """A copy, to compare with later counts (``stats - snapshot``)."""
        return dataclasses.replace(self)

    def __sub__(self, earlier: Self) -> Self:
        return type(self)(
            **{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in dataclasses.fields(self)}
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(slots=True)
class ListenerStats(_Stats):
    notifications: int = 0  # NOTIFY payloads heard
    entries: int = 0  # stream entries in them, followed here or not
    hear_seconds: float = 0.0  # CPU time spent decoding them (hear_seconds / entries: the cost per entry)
    reconnects: int = 0  # of the LISTEN connection, after the first connect
    listen_errors: int = 0  # the LISTEN connection lost (or found silent)
    listen_checks: int = 0  # queries proving the LISTEN connection alive, one every LISTEN_CHECK_INTERVAL
    polls: int = 0  # fallback polls that marked followed streams
    poll_found: int = 0  # polled streams that had chunks no notification announced
    fetches: int = 0  # fetch rounds
    fetch_errors: int = 0  # fetch rounds that failed, and pages the database refused
    fetch_seconds: float = 0.0  # time spent in fetch rounds
    chunks_fetched: int = 0
    data_fetched: int = 0  # of those chunks: characters of text, bytes of binary
    read_behind: int = 0  # rounds that found READ_DATABASE behind what was announced
    restarts: int = 0  # of the listener's loops after an unexpected failure


@dataclasses.dataclass(slots=True)
class FlusherStats(_Stats):
    flushes: int = 0
    notified: int = 0  # stream announcements sent
    payloads: int = 0  # NOTIFY payloads sent
    failed_flushes: int = 0
    dropped: int = 0  # announcements dropped: a failed flush, a full buffer


@dataclasses.dataclass(slots=True)
class AppenderStats(_Stats):
    batches: int = 0  # committed
    appended: int = 0  # chunks (items' sizes) in committed batches (written, or refused for their stream)
    retries: int = 0  # batches sent again after they certainly did not commit
    resolved: int = 0  # batches whose commit got no answer, found committed
    splits: int = 0  # batches split because the database refused them whole
    cpu_seconds: float = 0.0  # the appender thread's CPU time
