"""Generations on real worker processes (django-tasks-db's ``db_worker``): a worker killed
mid-answer, another stopped past its lease and continued, a stop during the takeover, and a
generation whose every attempt dies; each answer written whole, once, by one writer at a time."""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import django
import httpx
import pytest
from django.contrib.auth import get_user_model

import pgstreams
from bench.tasks import answer, count
from demo_project.chat.models import Conversation
from pgstreams import aisdk, generations
from pgstreams.models import Chunk, Stream
from tests.conftest import demo, open_server, serving
from tests.helpers import ROOT, Workers, free_port, in_thread, make_project

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess]

N = 40  # chunks an answer has
DELAY = 0.05  # seconds between two of them
LEASE = 1.0  # seconds a writer's lease lasts: takeovers within seconds


@pytest.fixture(scope="module")
def demo_process(django_db_setup: None) -> Iterator[str]:
    """The demo without model workers of its own: these tests start theirs, to lose them."""
    with demo(workers=0) as host:
        yield host


@pytest.fixture
def workers() -> Iterator[Workers]:
    pool = Workers(2)
    try:
        yield pool
    finally:
        pool.stop()
        generations.stop_thread()


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


def lose(workers: Workers, stream: Stream, how: str) -> None:
    """Lose the worker writing ``stream``: "killed" (SIGKILL), or "stopped" (SIGSTOP until
    another worker has written five chunks of it, then SIGCONT: its next write is fenced)."""
    process = workers.running(stream)
    if how == "killed":
        process.kill()
        return
    process.send_signal(signal.SIGSTOP)
    before = len(texts(stream))
    until(lambda: len(texts(stream)) > before + 5 or closed(stream))
    process.send_signal(signal.SIGCONT)


WHOLE = [f"{i} " for i in range(N)] + ["end"]


def test_a_worker_killed_mid_answer_is_taken_over_and_the_answer_written_once(workers: Workers) -> None:
    s = generations.start(count, N, DELAY, last="failed", lease=LEASE)
    until(lambda: len(texts(s)) >= 10)
    victim = workers.running(s)
    victim.kill()
    killed_at, before = time.monotonic(), len(texts(s))
    until(lambda: len(texts(s)) > before)
    took = time.monotonic() - killed_at
    until(lambda: closed(s))
    assert texts(s) == WHOLE
    print(f"killed mid-answer: the next chunk {took:.2f} s after the kill (lease {LEASE} s)")


def test_a_worker_stopped_past_its_lease_is_fenced_when_it_goes_on(workers: Workers) -> None:
    s = generations.start(count, N, DELAY, last="failed", lease=LEASE)
    until(lambda: len(texts(s)) >= 10)
    victim = workers.running(s)
    victim.send_signal(signal.SIGSTOP)
    before = len(texts(s))
    until(lambda: len(texts(s)) > before + 5)  # another worker took it and goes on
    victim.send_signal(signal.SIGCONT)  # its next write is refused
    until(lambda: closed(s))
    time.sleep(3 * DELAY)
    assert texts(s) == WHOLE


def test_a_stop_during_the_takeover_ends_the_answer(workers: Workers) -> None:
    s = generations.start(count, N, DELAY, last="failed", lease=LEASE)
    until(lambda: len(texts(s)) >= 5)
    victim = workers.running(s)
    victim.kill()
    stopped = pgstreams.append(s.id, "stopped", close=True)
    time.sleep(3 * LEASE)  # no attempt writes to an ended answer
    assert texts(s)[-1] == "stopped" and texts(s)[stopped] == "stopped"


def test_a_stop_after_the_takeover_while_the_fenced_run_is_paused_ends_the_answer_for_both(workers: Workers) -> None:
    """A worker stopped (SIGSTOP) past its lease; another takes the answer over and goes on;
    the answer is stopped then, and the first worker continued: neither writes after the stop."""
    s = generations.start(count, N, DELAY, last="failed", lease=LEASE)
    until(lambda: len(texts(s)) >= 5)
    paused = workers.running(s)
    paused.send_signal(signal.SIGSTOP)
    before = len(texts(s))
    until(lambda: len(texts(s)) > before + 3)  # taken over, going on
    stopped = pgstreams.append(s.id, "stopped", close=True)
    paused.send_signal(signal.SIGCONT)
    time.sleep(3 * LEASE)
    assert texts(s) == WHOLE[:stopped] + ["stopped"]


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
        generations.stop_thread()


def test_a_last_chunk_the_stream_cannot_hold_is_refused_and_nothing_is_made() -> None:
    from django_tasks_db.models import DBTaskResult

    before = (Stream.objects.count(), DBTaskResult.objects.count())
    with pytest.raises(pgstreams.InvalidChunk, match="application/json"):
        generations.start(count, N, DELAY, last="not json", stream={"content_type": "application/json"})
    assert (Stream.objects.count(), DBTaskResult.objects.count()) == before
    generations.stop_thread()


def test_a_generation_whose_task_this_process_cannot_enqueue_is_left_and_others_are_taken_over() -> None:
    """Its task not importable here (another project's, sharing the database): it is left for a
    process that can, untouched, and the generations found with it are taken over all the same
    (the look once failed whole, in every process, every second)."""
    from django.db import connection

    try:
        elsewhere = generations.start(count, N, DELAY, last="gone", queue_timeout=0.01)
        kept = generations.start(count, N, DELAY, last="failed", queue_timeout=0.01)
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE pgstreams_stream SET metadata = jsonb_set(metadata, '{pgstreams_generation,task}',"
                " '\"bench.tasks.no_such_task\"') WHERE id = %s",
                [elsewhere.id],
            )
        time.sleep(0.05)
        generations.take_over_expired()  # or this process's thread, first: either way
        until(lambda: Stream.objects.get(pk=kept.pk).metadata["pgstreams_generation"]["attempt"] == 2)
        assert Stream.objects.get(pk=elsewhere.pk).metadata["pgstreams_generation"]["attempt"] == 1
        assert not closed(elsewhere) and texts(elsewhere) == [] and not closed(kept)
    finally:
        generations.stop_thread()


def test_a_taken_generation_is_released_by_the_thread_that_held_it() -> None:
    """take() starts this process's generations thread; a ``with`` block that outlives it (the
    thread stopped meanwhile) does not start another just to let go."""
    generations.stop_thread()
    try:
        s = generations.start(count, N, DELAY, last="failed")
        generations.stop_thread()
        taken = generations.take(s.id)
        assert generations._thread.current() is not None  # it looks for takeovers from now on
        with taken:
            generations.stop_thread()
        assert generations._thread.current() is None
    finally:
        generations.stop_thread()


def test_a_lease_renewal_that_failed_is_tried_again_soon(monkeypatch) -> None:
    """Two renewals missed in a row lose the lease: after a failure the next comes within RETRY,
    not a third of the lease later."""
    calls: list[float] = []
    renew = generations.Taken.renew

    def failing_once(self) -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("a database blip")
        renew(self)

    monkeypatch.setattr(generations.Taken, "renew", failing_once)
    try:
        s = generations.start(count, N, DELAY, last="failed", lease=30.0)
        with generations.take(s.id):
            until(lambda: len(calls) >= 2, timeout=20)  # the first renewal is 10 s after the take
        assert calls[1] - calls[0] < 5  # not 10 s: within RETRY (0.5 s), on a slow machine too
    finally:
        generations.stop_thread()


def test_an_ai_sdk_answer_whose_worker_is_killed_is_one_message_written_once(workers: Workers) -> None:
    s = aisdk.start_generation(answer, N, DELAY, lease=LEASE)
    until(lambda: len(texts(s)) >= 10)
    workers.running(s).kill()
    until(lambda: closed(s))
    parts = [json.loads(chunk) for chunk in texts(s)]
    kinds = [p["type"] for p in parts]
    assert kinds == ["start", "start-step", "text-start"] + ["text-delta"] * N + ["text-end", "finish-step", "finish"]
    assert "".join(p["delta"] for p in parts if p["type"] == "text-delta") == "".join(f"w{i} " for i in range(N))
    assert {p["id"] for p in parts if "id" in p} == {"text-1"}


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_websocket_and_sse_readers_see_the_answer_go_on_after_its_worker_is_lost(workers: Workers, how: str) -> None:
    """Readers that follow the answer live while its worker is killed, or stopped past its lease
    and continued: the answer pauses for the takeover and goes on, every chunk once, in order,
    none from the lost run twice."""
    from bench import catchup

    with open_server("daphne") as host:
        base = f"http://{host}"
        s = generations.start(count, N, DELAY, last="failed", lease=LEASE)
        with ThreadPoolExecutor(2) as readers:
            read = {kind: readers.submit(catchup.READERS[kind], base, str(s.id)) for kind in catchup.TRANSPORTS}
            until(lambda: len(texts(s)) >= 10)
            lose(workers, s, how)
            until(lambda: closed(s))
            offsets = {kind: future.result(timeout=60) for kind, future in read.items()}
    assert texts(s) == WHOLE
    assert offsets == {kind: list(range(len(WHOLE))) for kind in catchup.TRANSPORTS}


@pytest.mark.parametrize("how", ["killed", "stopped"])
@pytest.mark.parametrize("route", ["ui-message-stream", "durable-streams", "websocket"])
def test_the_sdk_client_resuming_a_generation_shows_one_message_across_a_lost_worker(
    workers: Workers, demo_server: str, route: str, how: str
) -> None:
    """The AI SDK's own client (Node), resuming the chat's answer as a page does, with either
    transport, while the answer's worker is killed, or stopped past its lease and continued:
    one assistant message, every word once."""
    from tests.test_aisdk import ROUTES, signed_in, start, text

    user = get_user_model().objects.create_user("generation-user")
    path = f"chat/gen-{route}-{how}"
    s = aisdk.start_generation(answer, N, DELAY, lease=LEASE, stream={"owner": user, "path": path})
    Conversation.objects.create(user=user, prompt="count", stream=s, chat_id="generation")
    prompt = {"id": "prompt", "role": "user", "parts": [{"type": "text", "text": "count"}]}
    client = start(demo_server, {**signed_in(user), **ROUTES[route]}, "generation", "resume", messages=[prompt])
    until(lambda: len(texts(s)) >= 10)
    lose(workers, s, how)
    result = json.loads(client.communicate(timeout=90)[0].splitlines()[-1])
    assert result["status"] == "ready" and [m["role"] for m in result["messages"]] == ["user", "assistant"]
    assert text(result["messages"][1]) == "".join(f"w{i} " for i in range(N))


def test_use_chat_over_the_chat_socket_in_chromium_goes_on_across_a_killed_worker(
    workers: Workers, demo_server: str, page
) -> None:
    """The demo's page (ai 7's useChat over its chat socket) following a generation whose worker
    is killed mid-answer: the takeover's words follow in the same message, each once."""
    from tests.test_aisdk import answers, open_chat

    user = in_thread(lambda: get_user_model().objects.get(username="demo"))
    s = in_thread(lambda: aisdk.start_generation(answer, N, DELAY, lease=LEASE, stream={"owner": user}))
    in_thread(lambda: Conversation.objects.create(user=user, prompt="count", stream=s, chat_id="taken-over"))
    open_chat(page, demo_server)
    page.goto(f"http://{demo_server}/ai/c/taken-over/")
    in_thread(lambda: until(lambda: len(texts(s)) >= 10))
    in_thread(lambda: workers.running(s).kill())
    page.wait_for_function("document.querySelector('li[data-role=assistant]')?.textContent.endsWith('w39 ')")
    page.wait_for_selector("#ai-status[data-state=ready]")
    assert answers(page) == ["".join(f"w{i} " for i in range(N))]


HOWTO = ROOT / "docs" / "howto" / "generations.md"


def howto_files() -> dict[str, str]:
    """The how-to's blocks, by the file their first line names."""
    section = HOWTO.read_text()
    blocks = re.findall(r"```python\n# (\S+\.py)[^\n]*\n(.*?)```", section, re.S)
    return {name: body for name, body in blocks}


@pytest.mark.slow
def test_a_project_made_from_the_howtos_blocks_survives_a_worker_kill(tmp_path) -> None:
    """startproject, the how-to's settings, task, view and URL, its worker command: the answer
    a view started goes on when the worker writing it is killed, and is written once."""
    from django_tasks_db.models import DBTaskResult

    files = howto_files()
    assert set(files) == {"myproject/settings.py", "myapp/tasks.py", "myapp/views.py", "myproject/urls.py"}
    extra = ""
    if django.VERSION < (6, 0):  # as the how-to's comments say
        extra = 'INSTALLED_APPS += ["django_tasks"]'
        files["myapp/tasks.py"] = files["myapp/tasks.py"].replace(
            "from django.tasks import", "from django_tasks import"
        )
    env = make_project(tmp_path, files, extra)
    port = free_port()
    server = [sys.executable, "-m", "uvicorn", "myproject.asgi:application", "--port", str(port)]
    pool = Workers(2, cwd=tmp_path, env=env)
    try:
        with serving(server, port, env=env, cwd=tmp_path) as host:
            csrf = "readmegenerationtestcsrftoken123"
            answer = httpx.post(
                f"http://{host}/count/", cookies={"csrftoken": csrf}, headers={"X-CSRFToken": csrf}, timeout=30
            )
            assert answer.status_code == 200, answer.text[:300]
            s = Stream.objects.get(pk=answer.json()["stream"])
            until(lambda: len(texts(s)) >= 10)
            running = DBTaskResult.objects.filter(status="RUNNING", args_kwargs__args__0=str(s.id))
            until(lambda: running.exists())
            pool.processes[running.get().worker_ids[-1]].kill()
            until(lambda: closed(s), timeout=60)
    finally:
        pool.stop()
    assert texts(s) == [f"{i} " for i in range(100)] + ["end"]


# Bounded stalls (issue 56): what a stalled, failed or hung run may hold, and for how long.


def attempt(stream: Stream) -> int:
    return Stream.objects.get(pk=stream.pk).metadata["pgstreams_generation"]["attempt"]


def stop_inside_its_transaction(process, tries: int = 2000) -> None:
    """SIGSTOP ``process`` until the pause lands while its appender's transaction holds a
    stream's row (its backend idle in transaction, with an xid): bounded in tries."""
    from django.db import connection

    name = f"pgstreams appender {process.pid}"
    with connection.cursor() as cursor:
        for _ in range(tries):
            process.send_signal(signal.SIGSTOP)
            time.sleep(0.002)  # the backend reports what it was left doing
            cursor.execute(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = %s"
                " AND state = 'idle in transaction' AND backend_xid IS NOT NULL",
                [name],
            )
            if cursor.fetchone() is not None:
                return
            process.send_signal(signal.SIGCONT)
            time.sleep(0.001 * (_ % 7))
    raise AssertionError(f"no pause landed inside an append transaction in {tries} tries")


@pytest.mark.parametrize("then", ["taken over", "stopped"])
def test_a_writer_stopped_inside_its_append_transaction_holds_the_answer_no_longer_than_the_idle_bound(
    workers: Workers, then: str
) -> None:
    """The pause lands between the appender's row lock and its COMMIT: Postgres ends that
    session after the idle bound (half of QUERY_TIMEOUT), so another worker takes the answer
    over, or a stop ends it, while the writer is still stopped; it is fenced when continued."""
    from pgstreams import db

    s = generations.start(count, 2000, 0.001, last="failed", lease=LEASE)
    until(lambda: len(texts(s)) >= 10)
    victim = workers.running(s)
    stop_inside_its_transaction(victim)
    stopped_at, before = time.monotonic(), len(texts(s))
    try:
        if then == "stopped":
            offset = pgstreams.append(s.id, "stopped", close=True)  # the row is free once the session is ended
            took = time.monotonic() - stopped_at
            assert texts(s)[offset] == "stopped"
        else:
            took = until(lambda: len(texts(s)) > before + 5)
    finally:
        victim.send_signal(signal.SIGCONT)
    print(f"writer stopped in its transaction; {then} {took:.2f} s later (idle bound {db.idle_bound()} s)")
    # The how-to's bound (the longer of the lease and the idle bound, a look, a poll of 0.05 s),
    # with room for a busy machine: without the idle bound it was never.
    assert took < max(LEASE, db.idle_bound()) + generations.TAKEOVER_INTERVAL * 1.2 + 0.05 + 5
    until(lambda: closed(s))
    written = texts(s)
    if then == "stopped":
        assert written == [f"{i} " for i in range(len(written) - 1)] + ["stopped"]
    else:
        assert written == [f"{i} " for i in range(2000)] + ["end"]


@pytest.mark.parametrize("where", ["before", "inside"])
def test_a_run_that_fails_before_or_inside_its_take_is_taken_over_at_once(workers: Workers, where: str) -> None:
    """Its task fails (a stale connection, say) without ending the generation: the worker's
    task_finished gives the lease up, and the next look takes it over; it does not wait out
    queue_timeout (600 s) or the lease."""
    s = generations.start(count, N, DELAY, fail_first=where, last="failed", lease=30.0)
    took = until(lambda: attempt(s) == 2, timeout=20)
    until(lambda: closed(s))
    assert texts(s) == WHOLE
    print(f"a run that failed {where} its take: taken over {took:.2f} s after the start (lease 30 s)")


def test_a_worker_that_dies_after_starting_a_run_but_before_its_take_is_taken_over_within_the_lease(
    workers: Workers,
) -> None:
    """Killed, or unable to record the failure on a connection a failover cut, the worker sends
    no task_finished: the lease counts from the run's start (task_started), so the answer waits
    the lease, not queue_timeout (600 s)."""
    lease = 2.0
    s = generations.start(count, N, DELAY, fail_first="dies before", last="failed", lease=lease)
    took = until(lambda: attempt(s) == 2, timeout=lease + 15)
    until(lambda: closed(s))
    assert texts(s) == WHOLE
    print(f"a worker that died before its take: taken over {took:.2f} s after the start (lease {lease} s)")
    # The how-to's bound (lease, a look, a poll of 0.05 s) from the run's start, with room for the
    # worker's claim and a busy machine: before, queue_timeout (600 s).
    assert took < lease + generations.TAKEOVER_INTERVAL * 1.2 + 0.05 + 5


def test_a_late_task_started_never_brings_back_a_lease_given_up() -> None:
    """A run's task_started counts its lease from then, but only shortens it: once the run has
    given the lease up (task_finished), a late or repeated task_started leaves it run out."""
    from types import SimpleNamespace

    s = generations.start(count, 10, 0.01, last="failed", lease=30.0, queue_timeout=600.0)  # no worker runs it
    result = Stream.objects.get(pk=s.pk).metadata[generations.KEY]["result"]
    run = SimpleNamespace(args=[str(s.id), 10, 0.01], id=result)
    generations._task_started(None, run)
    started = Stream.objects.get(pk=s.pk).metadata["pgstreams_lease"]["until"]
    assert started - time.time() < 31  # counts the lease (30 s), no longer queue_timeout (600 s)
    assert generations.give_up(s.id, result)
    generations._task_started(None, run)  # late, or sent again
    assert Stream.objects.get(pk=s.pk).metadata["pgstreams_lease"]["until"] == 0
    generations.stop_thread()


TAKER = """
import sys, django
django.setup()
from django.db import connection
from pgstreams import generations
with connection.cursor() as cursor:
    cursor.execute("SELECT pg_backend_pid()")
    print(cursor.fetchone()[0], flush=True)
sys.stdin.readline()
print("taken", len(generations.take(sys.argv[1]).chunks), flush=True)
"""


def test_a_take_stopped_while_it_reads_the_stored_chunks_holds_no_lock() -> None:
    """take() reads what earlier runs stored once it has let the row go: a run stopped while
    the server sends it a long answer (its backend 'active', where no idle bound counts) leaves
    a stop and a takeover free. It held the row as long as it was stopped."""
    import os
    import subprocess

    from django.db import connection

    from tests.helpers import subprocess_database_url

    # No worker runs it, and no takeover comes before the test ends.
    s = generations.start(count, 10, 0.01, last="failed", lease=600.0, queue_timeout=600.0)
    env = {**os.environ, "DATABASE_URL": subprocess_database_url(), "DJANGO_SETTINGS_MODULE": "demo_project.settings"}
    for i in range(50):  # 30 MB: more than the socket buffers between the server and a stopped client hold
        pgstreams.write_many(s.id, [f"{i}:{j}:" + "y" * 60_000 for j in range(10)])
    with connection.cursor() as cursor:
        for _ in range(10):  # bounded: tries until the pause lands in the chunks' fetch
            taker = subprocess.Popen(
                [sys.executable, "-c", TAKER, str(s.id)],
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            backend = int(taker.stdout.readline())
            taker.stdin.write("go\n")
            taker.stdin.flush()
            deadline, landed = time.monotonic() + 20, False
            while not landed and taker.poll() is None and time.monotonic() < deadline:
                cursor.execute("SELECT state, query FROM pg_stat_activity WHERE pid = %s", [backend])
                row = cursor.fetchone()
                if row is not None and row[0] == "active" and "pgstreams_chunk" in row[1]:
                    taker.send_signal(signal.SIGSTOP)
                    time.sleep(0.2)  # the backend reports where the pause left it
                    cursor.execute("SELECT state, wait_event FROM pg_stat_activity WHERE pid = %s", [backend])
                    landed = cursor.fetchone() == ("active", "ClientWrite")  # still sending it the chunks
                    if not landed:
                        taker.send_signal(signal.SIGCONT)
                        break
            if landed:
                break
            taker.kill()
            taker.wait(10)
        else:
            pytest.fail("the taker was never seen reading the stored chunks")
    try:
        began = time.monotonic()
        offset = pgstreams.append(s.id, "stopped", close=True)  # what aisdk.stop does
        took = time.monotonic() - began
    finally:
        taker.send_signal(signal.SIGCONT)
        taker.kill()
        taker.wait(10)
    print(f"a take stopped in its fetch of 30 MB: a stop went through {took:.3f} s later")
    assert offset == 500 and Stream.objects.get(pk=s.pk).closed_at is not None


def test_a_run_taken_over_while_stopped_renews_nothing_and_writes_nothing_when_continued(workers: Workers) -> None:
    """Attempt 2 of 2 waits for a worker (the other is busy); the stopped writer of attempt 1
    is continued, then killed: its lease thread must not cut attempt 2's wait short (which would
    end the answer with its last chunk though attempt 2 never ran), nor may it write."""
    from demo_project.workers import start_worker
    from tests.helpers import running_worker, subprocess_database_url

    busy = generations.start(count, 150, DELAY, last="failed", lease=LEASE)  # worker-0 or worker-1
    until(lambda: len(texts(busy)) >= 1)
    env = {"DATABASE_URL": subprocess_database_url(), "DJANGO_SETTINGS_MODULE": "demo_project.settings"}
    for name, process in list(workers.processes.items()):  # the free one leaves; one that runs a task once comes
        if name != running_worker(busy.id):
            process.kill()
            process.wait(10)
            workers.processes[name] = start_worker(name, interval=0.05, env=env, max_tasks=1)
    s = generations.start(count, N, DELAY, last="failed", lease=LEASE, attempts=2)
    until(lambda: len(texts(s)) >= 5)
    writer = workers.running(s)
    writer.send_signal(signal.SIGSTOP)
    until(lambda: attempt(s) == 2)  # taken over; attempt 2 waits for a free worker
    at = len(texts(s))
    writer.send_signal(signal.SIGCONT)  # its lease thread, overdue, renews at once; its run writes
    writer.wait(30)  # fenced, the run ends, and the worker leaves after its one task
    time.sleep(4 * LEASE)
    assert not closed(s) and attempt(s) == 2 and len(texts(s)) == at  # still waiting, nothing written
    until(lambda: closed(busy), timeout=60)
    until(lambda: closed(s), timeout=60)  # the busy worker, free now, runs attempt 2
    assert texts(s) == WHOLE


def test_a_run_that_hangs_in_its_model_call_is_taken_over_after_its_stall_time(workers: Workers) -> None:
    """The process is alive (its lease thread would renew forever), but the run wrote nothing
    for ``stall`` seconds: its lease runs out, another worker takes over, the hung run is
    fenced."""
    s = generations.start(count, N, DELAY, hang_at=5, last="failed", lease=LEASE, stall=1.0)
    took = until(lambda: attempt(s) == 2, timeout=20)
    until(lambda: closed(s))
    assert texts(s) == WHOLE
    print(f"a run hung after 5 chunks: taken over {took:.2f} s after the start (stall 1 s, lease {LEASE} s)")


@pytest.mark.parametrize("bad", ["a\x00b", "a\ud800b", {"k\x00": 1}, float("nan")])
def test_arguments_postgres_cannot_store_are_refused_and_nothing_is_made(bad) -> None:
    from django_tasks_db.models import DBTaskResult

    before = (Stream.objects.count(), DBTaskResult.objects.count())
    with pytest.raises(ValueError, match="task arguments"):
        generations.start(count, N, DELAY, bad, last="failed")
    assert (Stream.objects.count(), DBTaskResult.objects.count()) == before
    generations.stop_thread()


def test_a_write_refused_before_it_is_stored_leaves_the_next_write_in_sequence() -> None:
    """A refused write (InvalidChunk) takes no producer seq: the next write is stored, not a
    ProducerGap."""
    try:
        s = generations.start(count, N, DELAY, last="failed", queue_timeout=60)
        with generations.take(s.id) as taken:
            taken.write("0 ")
            with pytest.raises(pgstreams.InvalidChunk):
                taken.write("a\x00b")
            taken.write("1 ")
            taken.close("end")
        assert texts(s) == ["0 ", "1 ", "end"]
    finally:
        generations.stop_thread()


def kinds(stream: Stream) -> list[str]:
    return [json.loads(chunk)["type"] for chunk in texts(stream)]


def test_a_run_that_takes_an_answer_over_after_its_text_ended_finishes_it_without_a_second_text_part() -> None:
    """Run 1 ended its text part and was lost before finish-step: run 2 writes finish-step and
    finish, not an empty second text part."""
    try:
        s = aisdk.start_generation(answer, N, DELAY, queue_timeout=60)
        with generations.take(s.id) as first:
            for chunk in (
                aisdk.part("start", messageId=aisdk.message_id(s.id)),
                aisdk.part("start-step"),
                aisdk.part("text-start", id="text-1"),
                aisdk.part("text-delta", id="text-1", delta="all of it"),
                aisdk.part("text-end", id="text-1"),
            ):
                first.write(chunk)
        assert aisdk.generate(s.id, lambda text: iter(["more"])) == "finish"
        assert kinds(s) == ["start", "start-step", "text-start", "text-delta", "text-end", "finish-step", "finish"]
    finally:
        generations.stop_thread()


def test_a_source_that_fails_ends_the_answer_with_its_error_in_the_same_append() -> None:
    """No takeover can come between the failure and the error part (it used to come after a
    text-end and a finish-step, and a run that took over then ended the answer with finish)."""

    def failing(text: str):
        yield "a few words"
        raise RuntimeError("the model failed")

    try:
        s = aisdk.start_generation(answer, N, DELAY, queue_timeout=60)
        assert aisdk.generate(s.id, failing) == "error"
        assert kinds(s) == ["start", "start-step", "text-start", "text-delta", "error"] and closed(s)
    finally:
        generations.stop_thread()


def test_the_idle_bound_is_set_for_pgstreams_own_transaction_and_never_for_a_callers() -> None:
    """take() inside the caller's atomic block leaves the caller's transaction as it was: a task
    that holds one open across a model call must not have its session ended."""
    from django.db import connection, transaction

    def bound_after_take() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('idle_in_transaction_session_timeout')")
            return cursor.fetchone()[0]

    try:
        s = generations.start(count, N, DELAY, last="failed", queue_timeout=60)
        with transaction.atomic():
            generations.take(s.id)
            assert bound_after_take() == "0"
        with transaction.atomic(), connection.cursor() as cursor:
            from pgstreams import db

            db.bound_idle("default", cursor)  # our own transaction: bounded
            assert bound_after_take() == f"{round(db.idle_bound() * 1000)}ms"
    finally:
        generations.stop_thread()


def test_a_write_whose_outcome_is_unknown_is_sent_again_as_it_was_and_stored_once(monkeypatch) -> None:
    """The write was stored, but its answer lost: the same write again is stored once; another
    in its place is refused, since it would take the place of one that may be stored."""
    real = generations.appends.append

    def stored_but_unanswered(*args, **kwargs):
        real(*args, **kwargs)
        monkeypatch.setattr(generations.appends, "append", real)
        raise pgstreams.OutcomeUnknown("the connection failed while committing (a test)")

    try:
        s = generations.start(count, N, DELAY, last="failed", queue_timeout=60)
        with generations.take(s.id) as taken:
            monkeypatch.setattr(generations.appends, "append", stored_but_unanswered)
            with pytest.raises(pgstreams.OutcomeUnknown):
                taken.write("0 ")
            with pytest.raises(pgstreams.StreamError, match="write the same data again"):
                taken.write("something else")
            assert taken.write("0 ") is None  # a duplicate: stored already
            taken.write("1 ")
            taken.close("end")
        assert texts(s) == ["0 ", "1 ", "end"]
    finally:
        generations.stop_thread()
