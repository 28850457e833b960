"""The Durable Streams endpoint: the protocol's official conformance suite against daphne, uvicorn
and granian, its official client against daphne, and what the suite does not check (pgstreams'
authorization, CSRF, the same streams through pgstreams' own API, waiting without database
connections)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import io
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test import AsyncClient, Client, override_settings
from django.utils import timezone

import pgstreams
from demo_project.servers import SERVERS
from pgstreams import conf, db, maintenance
from pgstreams.durable import store, wire
from pgstreams.models import Stream
from tests.conftest import open_server, serving
from tests.helpers import ROOT, free_port, node_dir
from tests.test_operations import kept_by_the_project

pytestmark = pytest.mark.django_db(transaction=True)

OPEN = override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": "demo_project.chat.durable.allow_everything"})
# How many non-skipped tests version 0.3.6 of the suite has.
SUITE_TESTS = 332


def url(path: str) -> str:
    return f"/pgstreams/v1/stream/{path}"


@pytest.fixture(scope="module")
def conformance(
    request: pytest.FixtureRequest,
    django_db_setup: None,
    django_db_blocker: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    """The official suite's report against each server whose test runs (daphne's in the default
    pass, the others' with ``-m slow``): the runs at once, since the suite spends most of its half
    a minute waiting (TTLs expiring, long-polls timing out). Each run has streams of its own (the
    suite names them uniquely), and all are over before the first test that reads them ends.
    Meanwhile this process compacts every stream the moment it is closed (no grace), again and
    again, so that the suite's reads, catch-ups, forks and offsets meet runs: under
    ``"compacted"``, how many streams it compacted, and under ``"errors"``, what it raised."""
    items = [(getattr(item, "originalname", ""), item) for item in request.session.items]
    selected = [
        item.callspec.params["server"]
        for name, item in items
        if name == "test_the_official_conformance_suite_passes_every_test"
    ]
    if any(
        name == "test_the_official_conformance_suite_passes_on_streams_compacted_as_it_reads_them" for name, _ in items
    ):
        selected = list(dict.fromkeys(["daphne", *selected]))
    suite = node_dir()
    runs = {}
    stop, compacted, errors = threading.Event(), [], []

    def compact_all() -> None:
        try:
            while not stop.wait(0.02):
                compacted.append(maintenance.compact(timezone.now() + datetime.timedelta(days=1), grace=0).streams)
        except Exception as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    compactor = threading.Thread(target=compact_all, name="compactor")
    with django_db_blocker.unblock(), contextlib.ExitStack() as servers:
        for name in selected:
            host = servers.enter_context(open_server(name))
            folder = tmp_path_factory.mktemp(name)
            env = {**os.environ, "CONFORMANCE_TEST_URL": f"http://{host}/pgstreams"}
            command = ["npx", "vitest", "run", "conformance.test.mjs", "--reporter=json"]
            command.append(f"--outputFile={folder / 'report.json'}")
            with (folder / "output").open("w") as output:  # a file, not a pipe: nothing waits for a reader
                run = subprocess.Popen(command, cwd=suite, env=env, stdout=output, stderr=subprocess.STDOUT)
            servers.callback(run.kill)  # a run still going when the block ends (a timeout)
            runs[name] = (run, folder)
        compactor.start()
        try:
            for run, _ in runs.values():
                run.wait(900)
        finally:
            stop.set()
            compactor.join(60)
    # A run that could not write its report fails its test with what it printed.
    reports: dict[str, Any] = {
        name: {
            "output": (folder / "output").read_text(),
            **(json.loads((folder / "report.json").read_text()) if (folder / "report.json").exists() else {}),
        }
        for name, (_, folder) in runs.items()
    }
    return {**reports, "compacted": sum(compacted), "errors": errors}


@pytest.mark.parametrize(
    "server", [name if name == "daphne" else pytest.param(name, marks=pytest.mark.slow) for name in SERVERS]
)
def test_the_official_conformance_suite_passes_every_test(conformance: dict[str, Any], server: str) -> None:
    results = conformance[server]
    assert_passed_whole(results)
    print(
        f"Durable Streams conformance suite under {server}: {results['numPassedTests']} passed, "
        f"{results['numFailedTests']} failed, {results['numPendingTests']} skipped, of {results['numTotalTests']}"
    )


def test_the_official_conformance_suite_passes_on_streams_compacted_as_it_reads_them(
    conformance: dict[str, Any],
) -> None:
    """The suite's runs (daphne's always) are made while every stream closed is compacted at
    once: daphne's passes whole, and compaction met the suite's streams and raised nothing."""
    assert_passed_whole(conformance["daphne"])
    print(f"suite on compacted streams: {conformance['compacted']} streams compacted as it read them")
    assert not conformance["errors"]
    assert conformance["compacted"] > 10  # the suite closes few of its streams: 48 were compacted when first measured


def assert_passed_whole(results: dict[str, Any]) -> None:
    assert "testResults" in results, results["output"][-3000:]
    failed = [
        f"{' > '.join(test['ancestorTitles'])} > {test['title']}: {test['failureMessages'][:1]}"
        for file in results["testResults"]
        for test in file["assertionResults"]
        if test["status"] == "failed"
    ]
    assert not failed, "\n".join(failed) or results["output"][-3000:]
    assert results["numPassedTests"] == results["numTotalTests"] - results["numPendingTests"] >= SUITE_TESTS


@pytest.mark.parametrize("live", ["long-poll", "sse"])
def test_the_official_client_reads_resumes_and_tails_a_stream_written_with_write(
    open_durable_server: str, live: str
) -> None:
    suite = node_dir()
    stream = pgstreams.create_stream(path=f"interop/{live}", content_type="text/plain")
    for token in ["Hello", ", ", "world"]:
        pgstreams.write(stream, token)
    stream_url = f"http://{open_durable_server}{url(stream.path)}"
    command = ["node", "client_interop.mjs", stream_url, live, wire.format_offset(2)]
    client = subprocess.Popen(command, cwd=suite, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        steps = {}
        for line in client.stdout:  # bounded: the client exits after the stream closes
            step = json.loads(line)
            steps[step.pop("step")] = step
            if "tailing" in steps and "written" not in steps:
                time.sleep(0.3)  # the client's live request is waiting
                for token in ["!", " more"]:
                    pgstreams.write(stream, token)
                    time.sleep(0.05)
                pgstreams.close(stream)
                steps["written"] = {}
        assert client.wait(30) == 0, client.stderr.read()
    finally:
        client.kill()
    print(json.dumps(steps))
    assert steps["catch-up"] == {"text": "Hello, world", "offset": wire.format_offset(3), "upToDate": True}
    assert steps["resume"] == {"text": "world"}
    assert steps["live"] == {"text": "! more", "closed": True, "offset": wire.format_offset(5)}


async def test_writes_are_refused_unless_the_project_allows_them() -> None:
    client = AsyncClient()
    stream = await pgstreams.acreate_stream(path="closed-shop/a")
    refused = [
        await client.put(url("closed-shop/b"), content_type="text/plain"),
        await client.post(url("closed-shop/a"), "hi", content_type="text/plain"),
        await client.post(url("closed-shop/a"), headers={"Stream-Closed": "true"}),
        await client.delete(url("closed-shop/a")),
    ]
    assert [r.status_code for r in refused] == [403, 403, 403, 403]
    assert refused[0]["X-Content-Type-Options"] == "nosniff"
    assert refused[0]["Content-Security-Policy"] == "sandbox; default-src 'none'"  # whatever a creator serves
    await stream.arefresh_from_db()
    assert (stream.next_offset, stream.is_closed) == (0, False)
    assert not await Stream.objects.filter(path="closed-shop/b").aexists()
    with OPEN:
        assert (await client.put(url("closed-shop/b"), content_type="text/plain")).status_code == 201


async def test_reads_follow_authorize_as_on_the_other_endpoints() -> None:
    owner = await sync_to_async(get_user_model().objects.create_user)("owner", password="pw")
    await pgstreams.acreate_stream(path="mine", owner=owner)
    await pgstreams.acreate_stream(path="anyones")
    anonymous, signed_in = AsyncClient(), AsyncClient()
    await signed_in.aforce_login(owner)
    assert (await anonymous.get(url("mine"))).status_code == 403
    assert (await anonymous.head(url("mine"))).status_code == 403
    assert (await anonymous.get(url("anyones"))).status_code == 200
    assert (await signed_in.get(url("mine"))).status_code == 200


async def test_a_writing_request_with_a_session_cookie_needs_the_csrf_token() -> None:
    user = await sync_to_async(get_user_model().objects.create_user)("writer", password="pw")
    client = AsyncClient(enforce_csrf_checks=True)
    await client.aforce_login(user)
    with OPEN:
        assert (await client.put(url("csrf"), "first", content_type="text/plain")).status_code == 403
        page = await client.get("/accounts/login/")  # sets the CSRF cookie
        token = page.cookies["csrftoken"].value
        created = await client.put(url("csrf"), "first", content_type="text/plain", headers={"X-CSRFToken": token})
        assert created.status_code == 201
        cookieless = AsyncClient(enforce_csrf_checks=True)  # an API client: nothing ambient to misuse
        appended = await cookieless.post(url("csrf"), "x", content_type="text/plain")
        assert appended.status_code == 204, appended.content


async def test_a_stream_made_over_http_is_a_pgstreams_stream() -> None:
    client = AsyncClient()
    with OPEN:
        await client.put(url("chat/1"), "Hello", content_type="text/plain")
        await client.put(url("blob"), b"\x00\xff", content_type="application/octet-stream")
        closing = {"Stream-Closed": "true"}
        await client.post(url("blob"), b"\x01", content_type="application/octet-stream", headers=closing)
    stream = await Stream.objects.aget(path="chat/1")
    await pgstreams.awrite(stream, ", world")
    await pgstreams.aclose(stream)
    assert [c.data async for c in pgstreams.aread(stream)] == ["Hello", ", world"]
    response = await client.get(url("chat/1"))
    assert (response.content, response["Stream-Closed"]) == (b"Hello, world", "true")
    blob = await Stream.objects.aget(path="blob")
    assert [c.data async for c in pgstreams.aread(blob)] == [b"\x00\xff", b"\x01"]


async def test_creates_of_one_path_at_once_make_one_stream_and_the_others_compare_with_it() -> None:
    # A create of a path with no row takes no lock: the path's uniqueness refuses the inserts
    # that lose, and those requests compare with the stream that won.
    client = AsyncClient()
    types = ["text/plain", "application/json"] * 6
    with OPEN:
        answers = await asyncio.gather(*(client.put(url("race/1"), headers={"Content-Type": t}) for t in types))
    winner = await Stream.objects.aget(path="race/1")
    statuses = [(t == winner.content_type, a.status_code) for t, a in zip(types, answers, strict=True)]
    assert sorted(statuses) == [(False, 409)] * 6 + [(True, 200)] * 5 + [(True, 201)]
    assert await Stream.objects.filter(path="race/1").acount() == 1


async def test_a_create_where_another_transaction_is_creating_holds_no_thread_while_it_waits() -> None:
    """Another connection has inserted a stream at `taken` and not committed. PUTs there, plain
    and as a fork, each wait at most LOCK_WAIT at a time, holding no write thread in between (a
    PUT of another path is answered meanwhile); once the other commits they compare with its
    stream: 200 for the same configuration, 409 for a fork."""
    await pgstreams.acreate_stream(path="source")
    holder = await psycopg.AsyncConnection.connect(**db.connect_kwargs("default", "test-holder"))
    await holder.execute("BEGIN")
    await holder.execute(
        "INSERT INTO pgstreams_stream (id, created_at, next_offset, label, metadata, path, content_type)"
        " VALUES (gen_random_uuid(), now(), 0, '', '{}', 'taken', 'text/plain')"
    )
    client, plain = AsyncClient(), {"Content-Type": "text/plain"}
    try:
        with OPEN:
            waiting = [asyncio.create_task(client.put(url("taken"), headers=plain)) for _ in range(5)]
            fork = asyncio.create_task(client.put(url("taken"), headers={**plain, "Stream-Forked-From": "source"}))
            await asyncio.sleep(0.5)
            free = await asyncio.wait_for(client.put(url("free"), headers=plain), 1.5)
            assert not any(task.done() for task in [*waiting, fork])  # still waiting on `taken`
            await holder.execute("COMMIT")
            answers = await asyncio.wait_for(asyncio.gather(*waiting, fork), 20)
    finally:
        await holder.close()
    assert free.status_code == 201
    assert [a.status_code for a in answers] == [200] * 5 + [409]


def test_waiting_long_polls_hold_no_database_connection() -> None:
    port = free_port()
    command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "demo_project.asgi:application"]
    stream = pgstreams.create_stream(path="many-waiters", content_type="text/plain")
    request = (
        f"GET {url(stream.path)}?offset={wire.format_offset(0)}&live=long-poll HTTP/1.1\r\n"
        "Host: 127.0.0.1\r\nConnection: close\r\n\r\n"
    ).encode()
    waiters = 200

    def backends() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
            return cursor.fetchone()[0]

    async def poll(sent: list[int]) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        sent.append(1)
        answer = await reader.read()  # until daphne closes the connection
        writer.close()
        return answer

    async def scenario() -> tuple[int, int, list[bytes]]:
        before = await sync_to_async(backends)()
        sent: list[int] = []
        tasks = [asyncio.create_task(poll(sent)) for _ in range(waiters)]
        for _ in range(100):  # bounded: until every request is sent
            if len(sent) == waiters:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # daphne has them all, waiting
        during = await sync_to_async(backends)()
        await sync_to_async(pgstreams.write)(stream, "wake")
        return before, during, await asyncio.wait_for(asyncio.gather(*tasks), 20)

    env = {"DEMO_OPEN_DURABLE_STREAMS": "1", "DEMO_LONG_POLL_TIMEOUT": "30"}
    with serving(command, port, env=env):
        before, during, answers = asyncio.run(scenario())
    print(f"{waiters} long-polls waiting in one daphne process: {before} backends before, {during} while they waited")
    # What the process opens whatever the number of readers: the listener's two connections, and
    # one per request thread (ASYNC_THREADS, 4) that served their first reads.
    assert during - before <= 2 + 4
    assert all(answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"wake") for answer in answers), answers[0]


async def test_an_sse_answer_ends_after_its_bytes_and_the_client_resumes_where_it_ended(monkeypatch) -> None:
    """A client that stops reading holds what one answer may send, not all that is written: the
    answer ends after SSE_BYTES, on a control event, and the next one starts at its offset."""
    from pgstreams.durable import views

    monkeypatch.setattr(views, "SSE_BYTES", 2000)
    s = await pgstreams.acreate_stream(path="sse/bytes")
    response = await AsyncClient().get(url("sse/bytes"), {"offset": "now", "live": "sse"})

    async def write() -> None:
        for i in range(60):
            await pgstreams.awrite(s.id, f"{i:03d}" + "x" * 97)

    async def read(answer) -> str:
        return b"".join([part async for part in answer.streaming_content]).decode()

    writing = asyncio.create_task(write())
    body = await asyncio.wait_for(read(response), 20)  # ends long before SSE_SECONDS
    events = [e for e in body.split("\n\n") if e.strip() and not e.startswith(":")]
    assert events[-1].startswith("event: control") and 2000 <= len(body) < 8000
    resume = json.loads(events[-1].partition("data:")[2])["streamNextOffset"]
    await writing
    await pgstreams.aclose(s.id)
    rest = (await AsyncClient().get(url("sse/bytes"), {"offset": resume})).content.decode()
    got = [line for e in events if e.startswith("event: data") for line in e.split("\n")[1:]]
    assert "".join(line.removeprefix("data:") for line in got) + rest == "".join(
        f"{i:03d}" + "x" * 97 for i in range(60)
    )


async def test_a_binary_stream_reaches_sse_and_the_admin_as_bytes() -> None:
    with OPEN:
        await AsyncClient().put(url("png"), b"\x89PNG\r\n", content_type="image/png")
    stream = await Stream.objects.aget(path="png")
    await pgstreams.aclose(stream)
    events = await AsyncClient().get(f"/pgstreams/streams/{stream.id}/events")
    body = b"".join([part async for part in events.streaming_content]).decode()
    assert '{"offset":0,"data":"iVBORw0K","encoding":"base64"}' in body
    root = await sync_to_async(get_user_model().objects.create_superuser)("root", password="pw")
    admin = AsyncClient()
    await admin.aforce_login(root)
    page = (await admin.get(f"/admin/pgstreams/stream/{stream.id}/change/")).content.decode()
    assert "6 bytes" in page and "image/png" in page


def test_prune_removes_expired_streams_and_a_source_with_forks_leaves_a_tombstone() -> None:
    client = Client()
    with OPEN:
        for name in ("expired", "source", "alive"):
            client.put(url(name), "x", content_type="text/plain", headers={"Stream-TTL": "60"})
        fork = {"Stream-Forked-From": "source", "Stream-TTL": "3600"}
        client.put(url("fork"), content_type="text/plain", headers=fork)
    an_hour_ago = timezone.now() - datetime.timedelta(hours=1)
    Stream.objects.filter(path__in=["expired", "source"]).update(used_at=an_hour_ago)
    out = io.StringIO()
    call_command("pgstreams_prune", "--closed-before", "7d", stdout=out)
    assert "removed 2 expired stream(s)" in out.getvalue()
    Stream.objects.filter(path="source").update(closed_at=timezone.now() - datetime.timedelta(days=30))
    call_command("pgstreams_prune", "--closed-before", "7d", stdout=io.StringIO())  # a tombstone is not pruned
    assert {(s.path, s.deleted_at is None) for s in Stream.objects.all()} == {
        ("source", False),  # a tombstone: its fork remains
        ("alive", True),
        ("fork", True),
    }
    assert client.get(url("fork")).content == b"x"  # the fork kept its copy
    with OPEN:
        assert client.head(url("source")).status_code == 410
        assert client.delete(url("fork")).status_code == 204
    assert set(Stream.objects.values_list("path", flat=True)) == {"alive"}  # the tombstone went with its fork


def appends_but_never_closes(request, action: str, path: str, stream) -> bool:
    return action in ("read", "create", "append")


def creates_but_reads_nothing(request, action: str, path: str, stream) -> bool:
    return action == "create"


async def test_an_append_that_closes_needs_leave_to_close_too() -> None:
    client = AsyncClient()
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": "tests.test_durable.appends_but_never_closes"}):
        await client.put(url("no-close"), "a", content_type="text/plain")
        closing = await client.post(url("no-close"), "b", content_type="text/plain", headers={"Stream-Closed": "true"})
        assert closing.status_code == 403
        assert (await client.post(url("no-close"), "b", content_type="text/plain")).status_code == 204
    stream = await Stream.objects.aget(path="no-close")
    assert (stream.next_offset, stream.is_closed) == (2, False)


async def test_a_refused_request_learns_nothing_of_the_path_and_forks_need_leave_to_read_the_source() -> None:
    anonymous = AsyncClient()
    await pgstreams.acreate_stream(path="private", owner=await sync_to_async(get_user_model().objects.create_user)("o"))
    # The default rule: a missing path and someone else's stream look the same.
    assert [(await anonymous.get(url(p))).status_code for p in ("private", "missing")] == [403, 403]
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": "tests.test_durable.creates_but_reads_nothing"}):
        fork = await anonymous.put(url("copy"), headers={"Stream-Forked-From": "private"})
    assert fork.status_code == 403
    assert not await Stream.objects.filter(path="copy").aexists()


def reads_what_its_metadata_makes_public(request, action: str, path: str, stream) -> bool:
    return action == "read" and stream is not None and stream.metadata.get("public") is True


async def test_the_rule_is_shown_the_streams_metadata_as_its_value() -> None:
    await pgstreams.acreate_stream(path="public", metadata={"public": True})
    await pgstreams.acreate_stream(path="unlisted", metadata={"public": False})
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": "tests.test_durable.reads_what_its_metadata_makes_public"}):
        statuses = [(await AsyncClient().get(url(path))).status_code for path in ("public", "unlisted")]
    assert statuses == [200, 403]  # the rule raised on a JSON string (403 both) before


async def test_writes_from_python_count_as_use_of_a_stream_with_a_ttl() -> None:
    """A write renews the TTL of a stream still alive (one past it is gone, for write() as for
    append(): test_write.py::test_a_stream_past_its_expiry_is_not_found_by_write_and_close_as_by_append)."""
    with OPEN:
        await AsyncClient().put(url("kept-alive"), "a", content_type="text/plain", headers={"Stream-TTL": "60"})
    stream = await Stream.objects.aget(path="kept-alive")
    last_use = timezone.now() - datetime.timedelta(seconds=50)
    await Stream.objects.filter(pk=stream.pk).aupdate(used_at=last_use)
    await pgstreams.awrite(stream, "b")  # its writer is still at it
    assert (await Stream.objects.aget(pk=stream.pk)).used_at > last_use + datetime.timedelta(seconds=45)
    response = await AsyncClient().get(url("kept-alive"))
    assert (response.status_code, response.content) == (200, b"ab")


async def test_a_long_poll_waiting_on_a_stream_deleted_under_it_answers_404_not_closed() -> None:
    client = AsyncClient()
    with OPEN:
        await client.put(url("doomed"), "a", content_type="text/plain")
        await client.put(url("doomed-fork"), headers={"Stream-Forked-From": "doomed"})
        tail = (await client.head(url("doomed")))["Stream-Next-Offset"]
        waiting = asyncio.create_task(client.get(url("doomed"), {"offset": tail, "live": "long-poll"}))
        await asyncio.sleep(0.5)
        assert (await client.delete(url("doomed"))).status_code == 204  # a tombstone: its fork remains
        answer = await asyncio.wait_for(waiting, 10)
        assert (await client.get(url("doomed"))).status_code == 410
    assert answer.status_code == 404 and "Stream-Closed" not in answer


async def test_a_fork_copies_at_most_max_fork_bytes_and_chains_at_most_max_fork_depth() -> None:
    """A fork owns copies of the chunks it inherits: a 370-byte PUT copied a 20 MB stream, and
    nothing bounded how often, nor how long a chain of forks grew."""
    client = AsyncClient()
    everyone = "demo_project.chat.durable.allow_everything"
    source = await pgstreams.acreate_stream(path="big")
    await pgstreams.awrite_many(source.id, ["x" * 65536] * 300)  # 19.7 MB: over the default's 16 MiB
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": everyone}):
        refused = await client.put(url("big-fork"), headers={"Stream-Forked-From": "big"})
        assert refused.status_code == 400 and b"MAX_FORK_BYTES'] = 16777216" in refused.content
        assert not await Stream.objects.filter(path="big-fork").aexists()  # nothing half-made
        at = wire.format_offset(200)  # 13.1 MB of it
        made = await client.put(url("big-fork"), headers={"Stream-Forked-From": "big", "Stream-Fork-Offset": at})
        assert made.status_code == 201, made.content
    small = await pgstreams.acreate_stream(path="small")
    await pgstreams.awrite_many(small.id, ["y" * 100] * 10)  # 200 bytes a chunk, its row counted
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": everyone, "MAX_FORK_BYTES": 1000, "MAX_FORK_DEPTH": 2}):
        over = {"Stream-Forked-From": "small", "Stream-Fork-Offset": wire.format_offset(6)}
        assert (await client.put(url("f1"), headers=over)).status_code == 400
        within = {"Stream-Forked-From": "small", "Stream-Fork-Offset": wire.format_offset(5)}
        assert (await client.put(url("f1"), headers=within)).status_code == 201
        assert (await client.put(url("f2"), headers={"Stream-Forked-From": "f1"})).status_code == 201
        deep = await client.put(url("f3"), headers={"Stream-Forked-From": "f2"})
        assert deep.status_code == 400 and b"MAX_FORK_DEPTH'] = 2 forks" in deep.content
        assert (await client.put(url("f3"), headers={"Stream-Forked-From": "f1"})).status_code == 201
    assert (await client.get(url("f2"))).content == b"y" * 500
    assert await Stream.objects.filter(path__in=["f1", "f2", "f3", "big-fork"]).acount() == 4


def writes_for_the_signed_in(request, action: str, path: str, stream) -> bool:
    """Writes for signed-in users, reads as the default rule says."""
    from pgstreams.auth import default_durable_authorize

    return request.user.is_authenticated or default_durable_authorize(request, action, path, stream)


async def test_a_stream_held_by_a_long_transaction_stalls_neither_refused_writes_nor_reads() -> None:
    """Another connection holds the row of `held` (as `atomic(): write(); <a slow model call>`
    does). Refused writes to it answer 403 while the lock is still held (the rule is asked before
    any lock); an allowed write waits at most QUERY_TIMEOUT, then answers 503 with Retry-After;
    and with every write thread waiting on the lock, reads of another stream are answered."""
    writer = await sync_to_async(get_user_model().objects.create_user)("w", password="pw")
    allowed = AsyncClient()
    await allowed.aforce_login(writer)
    held = await pgstreams.acreate_stream(path="held", owner=writer)
    await pgstreams.acreate_stream(path="other")
    await pgstreams.awrite_many(await Stream.objects.aget(path="other"), ["o"])
    rule = {"DURABLE_AUTHORIZE": "tests.test_durable.writes_for_the_signed_in", "QUERY_TIMEOUT": 2.0}
    holder = await psycopg.AsyncConnection.connect(**db.connect_kwargs("default", "test-holder"))
    await holder.execute("BEGIN")
    await holder.execute("SELECT 1 FROM pgstreams_stream WHERE id = %s FOR UPDATE", [held.id])
    try:
        with override_settings(PGSTREAMS=rule):
            waiting = [asyncio.create_task(allowed.post(url("held"), "x", content_type="text/plain")) for _ in range(6)]
            await asyncio.sleep(0.3)  # every write thread now waits on the row
            anonymous = AsyncClient()
            refused = await asyncio.wait_for(
                asyncio.gather(*(anonymous.post(url("held"), "x", content_type="text/plain") for _ in range(4))), 1.5
            )
            read = await asyncio.wait_for(anonymous.get(url("other")), 1.5)
            assert not all(task.done() for task in waiting)  # the lock is still held
            answers = await asyncio.wait_for(asyncio.gather(*waiting), 20)
    finally:
        await holder.execute("ROLLBACK")
        await holder.close()
    assert [r.status_code for r in refused] == [403] * 4
    assert (read.status_code, read.content) == (200, b"o")
    assert {r.status_code for r in answers} == {503} and answers[0]["Retry-After"] == "1"
    assert (await Stream.objects.aget(path="held")).next_offset == 0


async def test_a_ttl_is_judged_by_the_databases_clock_and_a_refused_request_removes_nothing(monkeypatch) -> None:
    """A stream with a TTL of 2 s written twice in one transaction 1.5 s apart is alive 0.7 s
    after it commits (the write stamps its own moment, not the transaction's start: by that it
    would be 2.2 s past its last use); the application server's clock plays no part; and a request
    the rule refuses never removes a stream, even an expired one (an allowed one then does)."""
    owner = await sync_to_async(get_user_model().objects.create_user)("owner", password="pw")
    await pgstreams.acreate_stream(path="ttl/long", owner=owner)
    await Stream.objects.filter(path="ttl/long").aupdate(ttl=2)
    stream = await Stream.objects.aget(path="ttl/long")

    def long_transaction() -> None:
        with transaction.atomic():
            pgstreams.write(stream.id, "a")
            time.sleep(1.5)
            pgstreams.write(stream.id, "b")

    await sync_to_async(long_transaction)()
    await asyncio.sleep(0.7)
    anonymous, signed_in = AsyncClient(), AsyncClient()
    await signed_in.aforce_login(owner)
    assert (await anonymous.get(url("ttl/long"))).status_code == 403
    monkeypatch.setattr(timezone, "now", lambda: datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1))
    assert (await signed_in.get(url("ttl/long"))).content == b"ab"  # an hour ahead, by the app's clock
    monkeypatch.undo()
    await asyncio.sleep(2.2)  # now expired, by the database's clock: as if there were no stream
    assert (await anonymous.get(url("ttl/long"))).status_code == 403
    assert (await signed_in.get(url("ttl/long"))).status_code == 403  # the default rule reads no missing stream
    assert await Stream.objects.filter(path="ttl/long").aexists()  # refused: nothing removed
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": "tests.test_durable.writes_for_the_signed_in"}):
        assert (await signed_in.get(url("ttl/long"))).status_code == 404  # allowed: removed on the way
    assert not await Stream.objects.filter(path="ttl/long").aexists()


def _howto_rule():
    """The DURABLE_AUTHORIZE example of the Durable Streams how-to, as written there."""
    howto = (ROOT / "docs" / "howto" / "durable-streams.md").read_text()
    blocks = [block.split("```", 1)[0] for block in howto.split("```python\n")[1:]]
    source = next(block for block in blocks if "def authorize(request, action, path, stream)" in block)
    namespace: dict = {}
    exec(compile(source, "docs/howto/durable-streams.md", "exec"), namespace)  # the how-to's own code, not a copy
    return namespace["authorize"]


def howto_rule(request, action: str, path: str, stream) -> bool:
    return _howto_rule()(request, action, path, stream)


def broken_rule(request, action: str, path: str, stream) -> bool:
    return stream.owner_id is None  # raises when there is no stream


async def test_the_howtos_rule_and_a_rule_that_raises_tell_no_one_which_paths_exist() -> None:
    alice = await sync_to_async(get_user_model().objects.create_user)("alice", password="pw")
    await pgstreams.acreate_stream(path=f"users/{alice.pk}/notes", owner=alice)
    await pgstreams.acreate_stream(path="shared/board")
    anonymous = AsyncClient()
    for rule in ("howto_rule", "broken_rule"):
        with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": f"tests.test_durable.{rule}"}):
            probes = [f"users/{alice.pk}/notes", f"users/{alice.pk}/does-not-exist"]
            assert [(await anonymous.get(url(p))).status_code for p in probes] == [403, 403], rule
            forks = [
                await anonymous.put(url(f"mine/{i}"), headers={"Stream-Forked-From": p}) for i, p in enumerate(probes)
            ]
            assert [f.status_code for f in forks] == [403, 403], rule
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": "tests.test_durable.howto_rule"}):
        assert (await anonymous.get(url("shared/board"))).status_code == 200
        owner = AsyncClient()
        await owner.aforce_login(alice)
        created = await owner.put(url(f"users/{alice.pk}/todo"), "x", content_type="text/plain")
        assert created.status_code == 201


def shortcut() -> httpx.AsyncClient:
    """A client of DurableStreamsFirst around a Django application, both made now, under the
    settings of the moment."""
    from django.core.asgi import get_asgi_application

    from pgstreams.durable.asgi import DurableStreamsFirst

    transport = httpx.ASGITransport(app=DurableStreamsFirst(get_asgi_application()))
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1")


async def test_the_shortcut_serves_a_project_under_a_script_prefix() -> None:
    """Under ASGI's ``root_path``, the endpoint's URLs are the prefixed ones: a fork may name its
    source by such a URL, and a request without the prefix after it is served unprefixed."""
    from django.core.asgi import get_asgi_application

    from pgstreams.durable.asgi import DurableStreamsFirst

    source = await pgstreams.acreate_stream(path="prefixed/source")
    await pgstreams.awrite(source.id, "inherited")
    app = DurableStreamsFirst(get_asgi_application())
    prefixed = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, root_path="/app"), base_url="http://127.0.0.1")
    plain = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")
    with OPEN:
        async with prefixed, plain:
            forked = await prefixed.put(
                "/app" + url("prefixed/fork"), headers={"Stream-Forked-From": "/app" + url("prefixed/source")}
            )
            assert forked.status_code == 201, forked.text
            assert forked.headers["Location"] == "http://127.0.0.1/app" + url("prefixed/fork")
            assert (await prefixed.get("/app" + url("prefixed/fork"))).content == b"inherited"
            again = await plain.put(url("prefixed/again"), headers={"Stream-Forked-From": url("prefixed/source")})
            assert again.status_code == 201 and again.headers["Location"] == "http://127.0.0.1" + url("prefixed/again")


class HeaderToken:
    """A project's own authentication: ``X-Token: <username>`` signs that user in."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        name = request.headers.get("X-Token")
        if name:
            request.user = get_user_model().objects.get(username=name)
        return self.get_response(request)


async def test_the_shortcut_hands_the_endpoint_to_django_when_it_cannot_stand_in_for_a_middleware() -> None:
    """A middleware it does not know (here a token authentication) runs: the endpoint's
    requests go through Django instead of being answered without it."""
    owner = await sync_to_async(get_user_model().objects.create_user)("token-owner", password="pw")
    await pgstreams.acreate_stream(path="shortcut/token", owner=owner)
    with override_settings(MIDDLEWARE=[*settings.MIDDLEWARE, "tests.test_durable.HeaderToken"]):
        async with shortcut() as client:
            assert (await client.get(url("shortcut/token"))).status_code == 403
            assert (await client.get(url("shortcut/token"), headers={"X-Token": "token-owner"})).status_code == 200


async def test_a_delete_of_a_stream_a_projects_object_points_at_deletes_as_django_does() -> None:
    """The demo's Conversation points at its answer's stream (on_delete CASCADE): the DELETE's raw
    delete failed at the commit (a foreign key still referenced it, a 500); Django's delete takes
    the conversation with it, as the admin's delete page says it will."""
    from demo_project.chat.models import Conversation

    user = await sync_to_async(get_user_model().objects.create_user)("asker")
    stream = await pgstreams.acreate_stream(path="pointed/at")
    await Conversation.objects.acreate(user=user, prompt="p", stream=stream)
    with OPEN:
        assert (await AsyncClient().delete(url("pointed/at"))).status_code == 204
    assert not await Stream.objects.filter(pk=stream.pk).aexists()
    assert not await Conversation.objects.filter(user=user).aexists()


def test_a_delete_of_a_stream_with_forks_a_protect_keeps_answers_409_and_changes_nothing() -> None:
    """The DELETE of a source with a fork made its tombstone by raw SQL, never asking its
    on_delete: 204, its chunks gone and its path answering 410, though a PROTECT kept it (the
    same DELETE without the fork answered 409)."""
    client = Client()
    with OPEN:
        client.put(url("kept/source"), "kept", content_type="text/plain")
        assert client.put(url("kept/fork"), headers={"Stream-Forked-From": "kept/source"}).status_code == 201
        with kept_by_the_project() as pin:
            pin.objects.create(stream=Stream.objects.get(path="kept/source"))
            refused = client.delete(url("kept/source"))
            assert refused.status_code == 409 and b"PROTECT or RESTRICT" in refused.content
            assert client.get(url("kept/source")).content == b"kept"
            assert Stream.objects.get(path="kept/source").deleted_at is None


def test_the_delete_of_a_last_fork_leaves_a_tombstone_a_protect_keeps_and_answers_204() -> None:
    """A tombstone whose last fork went was deleted in the fork's transaction: the PROTECT of an
    object made to point at the tombstone made the fork's DELETE answer 409 too. The tombstone now
    stays (and pruning's sweep leaves it) until nothing keeps it."""
    from pgstreams.durable.store import remove_orphan_tombstones

    client = Client()
    with OPEN:
        client.put(url("kept/source"), "kept", content_type="text/plain")
        assert client.put(url("kept/fork"), headers={"Stream-Forked-From": "kept/source"}).status_code == 201
        assert client.delete(url("kept/source")).status_code == 204  # a tombstone: its fork remains
        with kept_by_the_project() as pin:
            kept = pin.objects.create(stream=Stream.objects.get(path="kept/source"))
            assert client.delete(url("kept/fork")).status_code == 204
            assert client.head(url("kept/fork")).status_code == 404
            assert client.head(url("kept/source")).status_code == 410
            assert remove_orphan_tombstones(connection.alias) == 0
            kept.delete()
            assert remove_orphan_tombstones(connection.alias) == 1
    assert not Stream.objects.filter(path__startswith="kept/").exists()


def test_overlapping_deletes_of_a_tombstones_last_two_forks_take_the_tombstone_with_them() -> None:
    """Each delete of a fork looks for the other forks once it holds the tombstone's lock, which
    the other delete holds until it commits: the tombstone goes with the last one. Looking without
    waiting, each saw the other fork and the tombstone stayed, its path taken (found by attack)."""
    alias = conf.database()
    t = pgstreams.create_stream(path="orphans/t")
    a = pgstreams.create_stream(path="orphans/a")
    b = pgstreams.create_stream(path="orphans/b")
    Stream.objects.filter(pk__in=[a.pk, b.pk]).update(forked_from=t)
    store.remove(alias, t.pk)  # forks remain: a tombstone
    assert Stream.objects.get(pk=t.pk).deleted_at is not None
    barrier = threading.Barrier(2, timeout=3)
    errors = []

    def delete(sid):
        try:
            with transaction.atomic(using=alias):
                store.remove(alias, sid)
                try:
                    barrier.wait()  # both deletes done, neither committed: then both commit
                except threading.BrokenBarrierError:
                    errors.append("the other delete waited for this one (serialized)")
        except Exception as exc:  # reported by the assertion below
            errors.append(repr(exc))
        finally:
            connections.close_all()

    ths = [threading.Thread(target=delete, args=(s,)) for s in (a.pk, b.pk)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(30)
    assert not Stream.objects.filter(pk__in=[a.pk, b.pk]).exists(), errors
    left = list(Stream.objects.filter(pk=t.pk).values_list("path", "deleted_at"))
    assert left == [], f"tombstone with no fork left behind, holding its path: {left}"
