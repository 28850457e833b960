"""The benchmark's takeover mode (``--takeover``): generations (``pgstreams.generations``) in flight
on django-tasks-db's workers (``manage.py db_worker`` processes, one task each at a time), workers
writing them killed with SIGKILL at random moments; a spare worker per kill takes the answer over
(none is started during the run: a Django process starting takes a CPU for a second). Per kill:
the takeover time, from the kill to the next chunk of the answer that worker was writing. At the
end, every answer compared with what one uninterrupted run writes (chunks duplicated, lost), the
runs that found themselves fenced, and the answers' chunks per second over the run."""

from __future__ import annotations

import datetime
import os
import random
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import psutil
from django.db import connection
from django.db.models import Min

from demo_project.workers import start_worker
from pgstreams import generations
from pgstreams.models import Chunk, Stream

from .run import LABEL, percentiles
from .tasks import count


@dataclass
class TakeoverConfig:
    generations: int = 100  # answers in flight at once
    kills: int = 20
    chunks: int = 100  # per answer
    delay: float = 0.2  # seconds between two chunks of an answer: 5 a second, a model's pace
    lease: float = 2.0  # seconds; the takeover comes this long after a writer's last renewal, and about 1 s


class _Workers:
    """``db_worker`` processes by worker id, those alive in ``processes``."""

    def __init__(self, count: int) -> None:
        self.processes = {f"bench-worker-{i}": start_worker(f"bench-worker-{i}", interval=0.5) for i in range(count)}
        self._killed: list[subprocess.Popen[bytes]] = []

    def wait_started(self, timeout: float = 300) -> None:
        """Wait until the workers have started and only poll for tasks, using under half the
        machine's CPUs together: starting a hundred Django processes takes every CPU for a
        while, which the measurement must not include."""
        processes = [psutil.Process(p.pid) for p in self.processes.values()]
        deadline = time.monotonic() + timeout
        used = sum(sum(p.cpu_times()[:2]) for p in processes)
        while time.monotonic() < deadline:  # bounded
            time.sleep(1)
            now = sum(sum(p.cpu_times()[:2]) for p in processes)
            if now - used < (os.cpu_count() or 1) / 2:
                return
            used = now
        raise RuntimeError(f"the {len(processes)} workers were still busy starting after {timeout:.0f} s")

    def kill(self, worker_id: str) -> None:
        process = self.processes.pop(worker_id)
        process.kill()
        self._killed.append(process)

    def stop(self) -> None:
        for process in self.processes.values():
            process.kill()
        for process in [*self.processes.values(), *self._killed]:
            process.wait(30)


def run_takeover(config: TakeoverConfig, say: Callable[[str], None] = print) -> dict[str, Any]:
    from django_tasks_db.models import DBTaskResult

    _clean()  # what a run that failed left: its answers would be taken over again
    workers = _Workers(config.generations + config.kills)
    expected = [f"{i} " for i in range(config.chunks)] + ["end"]
    kills: list[tuple[str, float]] = []
    try:
        workers.wait_started()
        streams = [
            generations.start(
                count,
                config.chunks,
                config.delay,
                last="failed",
                lease=config.lease,
                attempts=config.kills + 2,
                stream={"label": LABEL},
            )
            for _ in range(config.generations)
        ]
        ids = {str(s.id) for s in streams}
        began = time.monotonic()
        say(f"takeover: {config.generations} answers of {config.chunks} chunks, {len(workers.processes)} workers")
        deadline = began + 600
        # Kills spread over the answers' writing time, while some are being written.
        pause = config.chunks * config.delay / (config.kills + 1)
        while len(kills) < config.kills and time.monotonic() < deadline:  # bounded
            time.sleep(random.uniform(0.5, 1.5) * pause)
            if not Stream.objects.filter(id__in=ids, closed_at__isnull=True).exists():
                break
            running = [
                (result.args_kwargs["args"][0], result.worker_ids[-1])
                for result in DBTaskResult.objects.filter(status="RUNNING")
                if result.worker_ids
                and result.worker_ids[-1] in workers.processes
                and result.args_kwargs["args"][0] in ids
            ]
            if not running:
                continue
            stream_id, worker_id = random.choice(running)
            workers.kill(worker_id)
            kills.append((stream_id, time.time()))
        while Stream.objects.filter(id__in=ids, closed_at__isnull=True).exists():  # bounded by the deadline
            if time.monotonic() > deadline:
                raise RuntimeError("the answers did not end within 10 minutes")
            time.sleep(0.2)
        seconds = time.monotonic() - began
    finally:
        workers.stop()
        generations.stop_thread()
    takeovers = []
    for stream_id, at in kills:
        first = Chunk.objects.filter(
            stream_id=stream_id, created_at__gt=datetime.datetime.fromtimestamp(at, tz=datetime.UTC)
        ).aggregate(Min("created_at"))
        if first["created_at__min"] is not None:
            takeovers.append(first["created_at__min"].timestamp() - at)
    duplicated = lost = 0
    for stream in streams:
        got = list(Chunk.objects.filter(stream=stream).order_by("offset").values_list("data", flat=True))
        duplicated += len(got) - len(set(got))
        lost += len(set(expected) - set(got))
    fenced = DBTaskResult.objects.filter(args_kwargs__args__0__in=list(ids), return_value="ProducerFenced").count()
    chunks = Chunk.objects.filter(stream__in=streams).count()
    _clean()
    report = {
        "config": asdict(config),
        "kills": len(kills),
        "takeover_ms": percentiles(takeovers, {"p50": 0.5, "p99": 0.99, "max": 1.0}),
        "taken_over": len(takeovers),
        "duplicated": duplicated,
        "lost": lost,
        "fenced_runs": fenced,
        "chunks_per_s": round(chunks / seconds, 1),
        "seconds": round(seconds, 1),
    }
    say(f"takeover: {report}")
    return {"takeover": report}


# A worker writing a generation holds Django's connection, its appender's, its flusher's and its
# generations thread's.
WORKER_CONNECTIONS = 4


def connections_problem(config: TakeoverConfig) -> str | None:
    """Why the server's max_connections cannot hold the run's workers, if it cannot: workers that
    cannot connect fail their renewals and appends, which would be measured as takeovers."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('max_connections')::int"
            " - coalesce(current_setting('reserved_connections', true), '0')::int"  # PostgreSQL 16 on
            " - current_setting('superuser_reserved_connections')::int"
        )
        allowed = cursor.fetchone()[0]
    workers = config.generations + config.kills
    needed = workers * WORKER_CONNECTIONS + 10
    if needed <= allowed:
        return None
    return (
        f"{workers} workers need about {needed} connections ({WORKER_CONNECTIONS} each) and the server allows "
        f"{allowed}: raise max_connections (ALTER SYSTEM SET max_connections = {needed + 20}, then restart the "
        "server) or ask for fewer --generations"
    )


def _clean() -> None:
    """Delete the benchmark's answers and their tasks."""
    from django_tasks_db.models import DBTaskResult

    DBTaskResult.objects.filter(task_path=count.module_path).delete()
    Stream.objects.filter(label=LABEL).delete()


def table(report: dict[str, Any]) -> str:
    r = report["takeover"]
    t = r["takeover_ms"]
    return "\n".join(
        [
            "answers  kills  takeover p50/p99/max ms   duplicated  lost  fenced runs  chunks/s",
            f"{r['config']['generations']:>7} {r['kills']:>6}  {t['p50']} / {t['p99']} / {t['max']:<13} "
            f"{r['duplicated']:>10} {r['lost']:>5} {r['fenced_runs']:>12} {r['chunks_per_s']:>9}",
        ]
    )
