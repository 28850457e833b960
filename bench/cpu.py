"""CPU time of the benchmark's parts, as the kernel counts it (user and system, with psutil): a
process with its descendants (a server and its workers), each of a list of processes, Postgres
(the postmaster and every process it started, those that have exited since included); and the
arithmetic that turns a run's seconds of each part into microseconds per delivered chunk.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from typing import Any

import psutil

PARTS = ("writer", "postgres", "server")  # a delivered token's CPU, end to end, in the order it is spent


def postmaster() -> psutil.Process:
    """The postmaster of the server that the project's database runs on; its children are the
    server's processes."""
    from django.db import connections

    from pgstreams import conf

    with connections[conf.database()].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return psutil.Process(cursor.fetchone()[0]).parent()


def each(processes: Iterable[Any], since: Mapping[int, float] | None = None) -> dict[int, float]:
    """CPU seconds of each of ``processes`` by pid, less what it had ``since`` (a process that
    started since counts all of its own; one that has ended is left out)."""
    used = {}
    for process in processes:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            used[process.pid] = times.user + times.system - (since or {}).get(process.pid, 0.0)
    return used


def tree(process: Any) -> float:
    """CPU seconds of a process and its live descendants (a server's workers)."""
    return sum(each([process, *process.children(recursive=True)]).values())


def postgres(master: Any) -> float:
    """CPU seconds of a Postgres server: its postmaster's own, its live processes' and those of
    the processes it has reaped (the kernel adds an exited child's time to its parent's when the
    parent waits for it), so that a backend ending within a window still counts."""
    times = master.cpu_times()
    return (
        times.user + times.system + times.children_user + times.children_system + sum(each(master.children()).values())
    )


def us_per(seconds: float | None, count: int, digits: int = 1) -> float | None:
    """Microseconds of CPU per one of ``count`` (None when nothing was counted or measured)."""
    return round(1e6 * seconds / count, digits) if count and seconds is not None else None


def per_delivery(seconds: Mapping[str, float | None], deliveries: int) -> dict[str, float | None]:
    """Each part of PARTS as ``<part>_cpu_us_per_delivery`` and their sum as
    ``total_cpu_us_per_delivery`` (None unless every part was measured)."""
    known = [seconds[part] for part in PARTS if seconds.get(part) is not None]
    total = sum(known) if len(known) == len(PARTS) else None
    figures = {f"{part}_cpu_us_per_delivery": us_per(seconds.get(part), deliveries, 2) for part in PARTS}
    return {**figures, "total_cpu_us_per_delivery": us_per(total, deliveries, 2)}
