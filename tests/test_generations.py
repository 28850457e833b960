"""Generations on real worker processes (django-tasks-db's ``db_worker``): a worker killed
mid-answer, another stopped past its lease and continued, a stop during the takeover, and a
generation whose every attempt dies; each answer written whole, once, by one writer at a time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.contrib.auth import get_user_model

import pgstreams
from bench.tasks import answer, count
from demo_project.chat.models import Conversation
from pgstreams import aisdk, generations
from pgstreams.models import Chunk, Stream
from tests.helpers import ROOT, subprocess_database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess]

N = 40  # chunks an answer has
DELAY = 0.05  # seconds between two of them
LEASE = 1.0  # seconds a writer's lease lasts: takeovers within seconds


class Workers:
    """``manage.py db_worker`` processes, named by their worker ids."""

    def __init__(self, count: int) -> None:
        env = {
            **os.environ,
            "DATABASE_URL": subprocess_database_url(),
            "DJANGO_SETTINGS_MODULE": "demo_project.settings",
        }
        self.processes = {
            f"worker-{i}": subprocess.Popen(
                [
                    sys.executable,
                    "manage.py",
                    "db_worker",
                    "--interval",
                    "0.05",
                    "--no-startup-delay",
                    "--worker-id",
                    f"worker-{i}",
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for i in range(count)
        }

    def running(self, stream: Stream, deadline: float) -> str:
        """The id of the worker running ``stream``'s generation now."""
        from django_tasks_db.models import DBTaskResult

        while time.monotonic() < deadline:  # bounded
            result = DBTaskResult.objects.filter(status="RUNNING", args_kwargs__args__0=str(stream.id)).first()
            if result is not None and result.worker_ids:
                return result.worker_ids[-1]
            time.sleep(0.02)
        raise AssertionError("no worker runs the generation")

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
            process.wait(10)


@pytest.fixture
def workers() -> Iterator[Workers]:
    pool = Workers(2)
    try:
        yield pool
    finally:
        pool.stop()
        generations.stop_takeovers()


def texts(stream: Stream) -> list[str]:
    return list(Chunk.objects.filter(stream=stream).order_by("offset").values_list("data", flat=True))


def until(condition, timeout: float = 30.0) -> float:
    """Wait (bounded) until ``condition()``; the time it took."""
    began = time.monotonic()
    while not condition():
        assert time.monotonic() - began < timeout, "not in time"
        time.sleep(0.01)
    return time.monotonic() - began


def closed(stream: Stream) -> bool:
    return Stream.objects.get(pk=stream.pk).closed_at is not None


WHOLE = [f"{i} " for i in range(N)] + ["end"]


def test_a_worker_killed_mid_answer_is_taken_over_and_the_answer_written_once(workers: Workers) -> None:
    s = generations.start(count, N, DELAY, last="failed", lease=LEASE)
    until(lambda: len(texts(s)) >= 10)
    victim = workers.running(s, time.monotonic() + 10)
    workers.processes[victim].kill()
    killed_at, before = time.monotonic(), len(texts(s))
    until(lambda: len(texts(s)) > before)
    took = time.monotonic() - killed_at
    until(lambda: closed(s))
    assert texts(s) == WHOLE
    print(f"killed mid-answer: the next chunk {took:.2f} s after the kill (lease {LEASE} s)")


def test_a_worker_stopped_past_its_lease_is_fenced_when_it_goes_on(workers: Workers) -> None:
    s = generations.start(count, N, DELAY, last="failed", lease=LEASE)
    until(lambda: len(texts(s)) >= 10)
    victim = workers.running(s, time.monotonic() + 10)
    workers.processes[victim].send_signal(signal.SIGSTOP)
    before = len(texts(s))
    until(lambda: len(texts(s)) > before + 5)  # another worker took it and goes on
    workers.processes[victim].send_signal(signal.SIGCONT)  # its next write is refused
    until(lambda: closed(s))
    time.sleep(3 * DELAY)
    assert texts(s) == WHOLE


def test_a_stop_during_the_takeover_ends_the_answer(workers: Workers) -> None:
    s = generations.start(count, N, DELAY, last="failed", lease=LEASE)
    until(lambda: len(texts(s)) >= 5)
    victim = workers.running(s, time.monotonic() + 10)
    workers.processes[victim].kill()
    stopped = pgstreams.append(s.id, "stopped", close=True)
    time.sleep(3 * LEASE)  # no attempt writes to an ended answer
    assert texts(s)[-1] == "stopped" and texts(s)[stopped] == "stopped"


def test_a_generation_whose_every_attempt_dies_ends_with_its_last_chunk(workers: Workers) -> None:
    s = generations.start(count, N, DELAY, 5, last="failed", lease=LEASE, attempts=2)
    until(lambda: closed(s))
    assert texts(s) == [f"{i} " for i in range(5)] + ["failed"]


def test_readers_leave_a_generation_whose_lease_ran_out_to_its_takeover() -> None:
    from pgstreams import leases

    try:
        s = generations.start(count, N, DELAY, last="failed", lease=LEASE, queue_timeout=0.01)
        plain = pgstreams.create_stream()
        leases.renew(plain.id, 0.01, "ended")
        time.sleep(0.05)
        assert leases.expired(plain.id) == "ended"
        assert leases.expired(s.id) is None  # a reader does not end it: a takeover runs it again
    finally:
        generations.stop_takeovers()


def test_an_ai_sdk_answer_whose_worker_is_killed_is_one_message_written_once(workers: Workers) -> None:
    s = aisdk.start_generation(answer, N, DELAY, lease=LEASE)
    until(lambda: len(texts(s)) >= 10)
    workers.processes[workers.running(s, time.monotonic() + 10)].kill()
    until(lambda: closed(s))
    parts = [json.loads(chunk) for chunk in texts(s)]
    kinds = [p["type"] for p in parts]
    assert kinds == ["start", "start-step", "text-start"] + ["text-delta"] * N + ["text-end", "finish-step", "finish"]
    assert "".join(p["delta"] for p in parts if p["type"] == "text-delta") == "".join(f"w{i} " for i in range(N))
    assert {p["id"] for p in parts if "id" in p} == {"text-1"}


def test_websocket_and_sse_readers_see_the_answer_go_on_after_its_worker_is_killed(workers: Workers) -> None:
    """Readers that follow the answer live while its worker is killed: the answer pauses for the
    takeover and goes on, every chunk once, in order, none from the killed run twice."""
    from bench import catchup
    from tests.conftest import open_server

    with open_server("daphne") as host:
        base = f"http://{host}"
        s = generations.start(count, N, DELAY, last="failed", lease=LEASE)
        with ThreadPoolExecutor(2) as readers:
            read = {kind: readers.submit(catchup.READERS[kind], base, str(s.id)) for kind in catchup.TRANSPORTS}
            until(lambda: len(texts(s)) >= 10)
            workers.processes[workers.running(s, time.monotonic() + 10)].kill()
            until(lambda: closed(s))
            offsets = {kind: future.result(timeout=60) for kind, future in read.items()}
    assert texts(s) == WHOLE
    assert offsets == {kind: list(range(len(WHOLE))) for kind in catchup.TRANSPORTS}


@pytest.mark.parametrize("route", ["ui-message-stream", "durable-streams"])
def test_the_sdk_client_resuming_a_generation_shows_one_message_across_a_kill(
    workers: Workers, demo_server: str, route: str
) -> None:
    """The AI SDK's own client (Node), resuming the chat's answer as a page does, with either
    transport, while the answer's worker is killed: one assistant message, every word once."""
    from tests.test_aisdk import ROUTES, signed_in, start, text

    user = get_user_model().objects.create_user("generation-user")
    s = aisdk.start_generation(answer, N, DELAY, lease=LEASE, stream={"owner": user, "path": f"chat/gen-{route}"})
    Conversation.objects.create(user=user, prompt="count", stream=s, chat_id="generation")
    prompt = {"id": "prompt", "role": "user", "parts": [{"type": "text", "text": "count"}]}
    client = start(demo_server, {**signed_in(user), **ROUTES[route]}, "generation", "resume", messages=[prompt])
    until(lambda: len(texts(s)) >= 10)
    workers.processes[workers.running(s, time.monotonic() + 10)].kill()
    result = json.loads(client.communicate(timeout=90)[0].splitlines()[-1])
    assert result["status"] == "ready" and [m["role"] for m in result["messages"]] == ["user", "assistant"]
    assert text(result["messages"][1]) == "".join(f"w{i} " for i in range(N))
