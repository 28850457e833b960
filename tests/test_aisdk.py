"""The AI SDK's UI message stream from pgstreams (``pgstreams.aisdk``): answers written as parts,
ended once by finish, error, stop or a lease run out (a writer's, or a queued answer's that no
writer started), served from their first part; then the SDK's own chat client (``node/aisdk_chat.mjs``:
@ai-sdk/react's ``Chat``, on ai 7 and, among the long runs, ai 6) against the demo under daphne, over HTTP
(``DefaultChatTransport``), the Durable Streams endpoint and (ai 7) the chat socket: a whole
answer, a reload mid-answer, two tabs, a stop then a reload, an answer read after it ended, and a
generating process killed mid-answer; a project made from the how-to's example alone, over HTTP
and the socket; and ``useChat`` itself in Chromium, on the demo's page over each of its
transports (vendored bundles, held to what their source builds)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import AsyncClient, Client, override_settings
from hypothesis import HealthCheck, given
from hypothesis import settings as examples
from hypothesis import strategies as st

import pgstreams
from demo_project.chat import llm
from demo_project.chat.models import Conversation
from pgstreams import aisdk, leases, protocol
from pgstreams.durable import views as durable_views
from pgstreams.models import Chunk, Stream
from tests.conftest import serving
from tests.helpers import ROOT, end_answers_in_flight, free_port, in_thread, make_project, node_dir

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess]

PROMPT = "Why does a NOTIFY per write not scale?"
WHOLE = "".join(llm.answer(PROMPT))
CSRF = "pgstreamsaisdktestcsrftoken12345"  # 32 characters: a CSRF secret, sent as cookie and header


def parts(stream: Stream | Any) -> list[dict[str, Any]]:
    rows = Chunk.objects.filter(stream_id=getattr(stream, "id", stream)).order_by("offset")
    return [json.loads(data) for data in rows.values_list("data", flat=True)]


def kinds(stream: Stream | Any) -> list[str]:
    return [p["type"] for p in parts(stream)]


async def served(stream_id: Any) -> list[str]:
    """What ``aisdk.response`` sends, event by event (the data of each)."""
    body = b"".join([piece async for piece in aisdk.response(stream_id).streaming_content])
    events = [event for event in body.decode().split("\n\n") if event and not event.startswith(":")]
    return [event.removeprefix("data: ") for event in events]


async def words(*items: str | dict, fail: bool = False, pause: float = 0.0):
    for i, item in enumerate(items):
        if i:
            await asyncio.sleep(pause)  # a model thinking between two deltas
        yield item
    if fail:
        raise RuntimeError("the model's connection broke")


# -- the library ---------------------------------------------------------------------------------


async def test_an_answer_is_stored_as_the_parts_of_one_message_and_served_from_its_first() -> None:
    stream = await sync_to_async(aisdk.create_answer)()
    reasoning = {"type": "reasoning-start", "id": "r1"}
    ending = await aisdk.write_answer(stream.id, words(reasoning, "Hello", ", world"))
    assert ending == "finish"
    stored = await sync_to_async(parts)(stream)
    assert [p["type"] for p in stored] == [
        *("start", "start-step", "reasoning-start", "text-start", "text-delta", "text-delta", "text-end"),
        *("finish-step", "finish"),
    ]
    assert stored[0]["messageId"] == aisdk.message_id(stream.id)
    assert "".join(p["delta"] for p in stored if p["type"] == "text-delta") == "Hello, world"
    assert (await Stream.objects.aget(pk=stream.pk)).is_closed
    events = await served(stream.id)
    assert [json.loads(e)["type"] for e in events[:-1]] == [p["type"] for p in stored] and events[-1] == "[DONE]"


async def test_a_source_that_raises_ends_its_answer_with_an_error_part_and_keeps_what_it_said() -> None:
    stream = await sync_to_async(aisdk.create_answer)()
    assert await aisdk.write_answer(stream.id, words("partial", fail=True)) == "error"
    stored = await sync_to_async(parts)(stream)
    assert [p["type"] for p in stored][-4:] == ["text-delta", "text-end", "finish-step", "error"]
    assert stored[-1]["errorText"] == aisdk.ERROR_TEXT  # the exception itself stays in the log
    assert (await Stream.objects.aget(pk=stream.pk)).is_closed


async def test_a_stop_ends_the_answer_with_abort_closes_its_source_and_a_second_stop_does_nothing() -> None:
    stream = await sync_to_async(aisdk.create_answer)()
    closed = asyncio.Event()

    async def endless():
        try:
            for i in range(10_000):
                yield f"w{i} "
                await asyncio.sleep(0.01)
        finally:
            closed.set()

    writing = asyncio.ensure_future(aisdk.write_answer(stream.id, endless()))
    await asyncio.sleep(0.3)
    assert await aisdk.astop(stream.id, reason="stopped by the user") is True
    assert await asyncio.wait_for(writing, 10) == "stopped" and closed.is_set()
    stored = await sync_to_async(parts)(stream)
    assert stored[-1] == {"type": "abort", "reason": "stopped by the user"}
    assert [p["type"] for p in stored].count("abort") == 1 and "finish" not in [p["type"] for p in stored]
    assert await aisdk.astop(stream.id) is False
    assert await sync_to_async(parts)(stream) == stored


async def test_a_stop_after_the_finish_does_nothing() -> None:
    stream = await sync_to_async(aisdk.create_answer)()
    await aisdk.write_answer(stream.id, words("done"))
    assert await aisdk.astop(stream.id) is False
    assert (await sync_to_async(kinds)(stream))[-1] == "finish"


async def test_an_answer_whose_writer_stopped_renewing_is_ended_by_its_reader_past_its_lease(monkeypatch) -> None:
    monkeypatch.setattr(aisdk, "LEASE", 0.3)
    monkeypatch.setattr(aisdk, "HEARTBEAT", 0.2)
    stream = await sync_to_async(aisdk.create_answer)()
    said = asyncio.Event()

    async def stalls():
        yield "so far"
        said.set()
        await asyncio.Event().wait()  # the model says nothing more

    writing = asyncio.ensure_future(aisdk.write_answer(stream.id, stalls()))
    await asyncio.wait_for(said.wait(), 10)
    writing.cancel()  # its lease is no longer renewed, as when its process dies
    with pytest.raises(asyncio.CancelledError):
        await writing
    events = await asyncio.wait_for(served(stream.id), 10)
    assert json.loads(events[-2]) == {"type": "error", "errorText": aisdk.ABANDONED_TEXT} and events[-1] == "[DONE]"
    assert "so far" in "".join(events)
    assert (await Stream.objects.aget(pk=stream.pk)).is_closed


async def test_an_answer_waiting_for_its_writer_past_the_lease_is_not_ended_and_its_writer_finishes_it(
    monkeypatch,
) -> None:
    """The lease counts from the writer's start: an answer queued behind busy writers is not dead."""
    monkeypatch.setattr(aisdk, "LEASE", 0.3)
    monkeypatch.setattr(aisdk, "HEARTBEAT", 0.2)
    stream = await sync_to_async(aisdk.create_answer)()  # its writer is busy with other answers
    body = aisdk.response(stream.id).streaming_content
    for _ in range(4):  # four silences, each looked at by the reader, the later ones past LEASE
        assert await asyncio.wait_for(anext(body), 10) == protocol.SSE_KEEPALIVE
    assert await aisdk.write_answer(stream.id, words("at", " last")) == "finish"
    events = [e.removeprefix("data: ") for e in b"".join([p async for p in body]).decode().split("\n\n")]
    events = [e for e in events if e and not e.startswith(":")]
    assert [json.loads(e)["type"] for e in events[:-1]][-2:] == ["finish-step", "finish"] and events[-1] == "[DONE]"
    assert "".join(p["delta"] for p in await sync_to_async(parts)(stream) if p["type"] == "text-delta") == "at last"


async def test_an_answer_no_writer_takes_is_ended_past_its_queue_timeout_and_a_late_writer_writes_nothing(
    monkeypatch,
) -> None:
    monkeypatch.setattr(aisdk, "HEARTBEAT", 0.2)
    stream = await aisdk.acreate_answer(queue_timeout=0.3)
    events = await asyncio.wait_for(served(stream.id), 10)
    assert [json.loads(e) for e in events[:-1]] == [{"type": "error", "errorText": aisdk.NOT_STARTED_TEXT}]
    assert events[-1] == "[DONE]" and (await Stream.objects.aget(pk=stream.pk)).is_closed
    assert await aisdk.write_answer(stream.id, words("too late")) == "stopped"
    assert await sync_to_async(kinds)(stream) == ["error"]


@pytest.mark.parametrize("given", [0, -1.0, float("nan"), float("inf"), "60"])
def test_a_queue_timeout_that_is_not_a_number_of_seconds_above_zero_is_refused_before_a_stream_is_made(
    given,
) -> None:
    with pytest.raises(ValueError, match="queue_timeout"):
        aisdk.create_answer(queue_timeout=given)
    assert not Stream.objects.exists()


async def test_a_writer_that_lives_keeps_its_lease_while_its_model_is_silent(monkeypatch) -> None:
    monkeypatch.setattr(aisdk, "LEASE", 2.0)  # renewed every 0.67 s
    monkeypatch.setattr(aisdk, "HEARTBEAT", 0.2)
    stream = await sync_to_async(aisdk.create_answer)()
    writing = asyncio.ensure_future(aisdk.write_answer(stream.id, words("thinking", "...done", pause=3.0)))
    events = await asyncio.wait_for(served(stream.id), 20)
    assert await writing == "finish"
    assert json.loads(events[-2])["type"] == "finish" and "error" not in "".join(events)


async def test_a_durable_streams_long_poll_that_times_out_on_a_stream_past_its_lease_ends_it() -> None:
    stream = await pgstreams.acreate_stream(path="leased", content_type="application/json")
    await pgstreams.aappend(stream.id, '{"said": "so far"}')
    await sync_to_async(leases.renew)(stream.id, 0.2, '{"said": "gone"}')
    client = AsyncClient()
    url = "/pgstreams/v1/stream/leased?offset=0000000000000001_0000000000000000&live=long-poll"
    with override_settings(
        PGSTREAMS={"DURABLE_AUTHORIZE": "demo_project.chat.durable.allow_everything", "LONG_POLL_TIMEOUT": 0.5}
    ):
        assert (await client.get(url)).status_code == 204  # silent, and past its lease by then
        ended = await client.get(url)
    assert ended.status_code == 200 and json.loads(ended.content) == [{"said": "gone"}]
    assert ended["Stream-Closed"] == "true"


async def test_a_stream_without_a_lease_is_never_ended_by_its_readers() -> None:
    stream = await pgstreams.acreate_stream()
    assert await leases.aend_if_expired(stream.id) is False
    assert not (await Stream.objects.aget(pk=stream.pk)).is_closed


async def test_a_part_with_newlines_is_framed_so_the_client_reads_it_whole() -> None:
    stream = await sync_to_async(aisdk.create_answer)()
    await pgstreams.aappend(stream.id, '{"type": "data-note",\n"data": "a\\nb"}\r\n', close=True)
    assert json.loads((await served(stream.id))[0].replace("\ndata: ", "\n")) == {"type": "data-note", "data": "a\nb"}


async def test_a_source_that_yields_neither_text_nor_a_part_is_refused_and_ends_the_answer() -> None:
    stream = await sync_to_async(aisdk.create_answer)()
    assert await aisdk.write_answer(stream.id, words({"no": "type"})) == "error"
    assert (await sync_to_async(kinds)(stream))[-1] == "error"


# -- the SDK's client against the demo -------------------------------------------------------------


ROUTES = {
    "ui-message-stream": {"api": "/ai/chat", "transport": "default"},  # DefaultChatTransport, pgstreams.aisdk.response
    "durable-streams": {"api": "/ai/durable/chat", "transport": "durable"},  # @durable-streams/aisdk-transport
    "websocket": {"api": "/ai/chat", "transport": "websocket"},  # ai 7's WebSocketChatTransport, pgstreams.aisdk_ws
    # The same clients on ai 6 (@ai-sdk/react 3), which has no WebSocket transport.
    "ui-message-stream-ai6": {"api": "/ai/chat", "transport": "default", "sdk": 6},
    "durable-streams-ai6": {"api": "/ai/durable/chat", "transport": "durable", "sdk": 6},
}


def on_each_sdk(names: list[str]) -> list[Any]:
    """Fixture params of ``names``, those of the older major (ai 6, named ``-ai6``) among the long
    runs (``-m slow``): the default pass runs the newest; CI runs both."""
    return [pytest.param(name, marks=pytest.mark.slow) if name.endswith("-ai6") else name for name in names]


@pytest.fixture(params=on_each_sdk(list(ROUTES)))
def chat_client(request, session) -> dict[str, Any]:
    """The session, the transport the SDK's client uses and the demo's endpoints for it (the
    test's id names the route)."""
    return {**session, **ROUTES[request.param]}


@pytest.fixture
def session() -> dict[str, str]:
    return signed_in(get_user_model().objects.create_user("aisdk-user"))


def signed_in(user: Any) -> dict[str, str]:
    """A session of ``user``, as the SDK's client sends it: its cookies and CSRF token."""
    client = Client()
    client.force_login(user)
    return {"cookie": f"sessionid={client.cookies['sessionid'].value}; csrftoken={CSRF}", "csrf": CSRF}


def sdk(server: str, session: dict[str, str], chat: str, action: str, **options: Any) -> dict[str, Any]:
    """Run the SDK's client once (node/aisdk_chat.mjs) and return what it printed."""
    config = {"base": f"http://{server}", **session, "chat": chat, "action": action, **options}
    run = subprocess.run(
        ["node", "aisdk_chat.mjs", json.dumps(config)], cwd=node_dir(), capture_output=True, text=True, timeout=90
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout.splitlines()[-1])


def start(server: str, session: dict[str, str], chat: str, action: str, **options: Any) -> subprocess.Popen[str]:
    config = {"base": f"http://{server}", **session, "chat": chat, "action": action, **options}
    return subprocess.Popen(
        ["node", "aisdk_chat.mjs", json.dumps(config)], cwd=node_dir(), stdout=subprocess.PIPE, text=True
    )


def text(message: dict[str, Any]) -> str:
    return "".join(p["text"] for p in message["parts"] if p["type"] == "text")


def roles(result: dict[str, Any]) -> list[str]:
    return [m["role"] for m in result["messages"]]


def latest_answer(chat: str) -> Stream:
    return Conversation.objects.filter(chat_id=chat).latest("created_at").stream


def test_the_sdk_client_gets_a_whole_answer_and_again_after_it_ended(demo_server: str, chat_client) -> None:
    sent = sdk(demo_server, chat_client, "whole", "send", prompt=PROMPT)
    major = str(chat_client.get("sdk", 7))
    assert [v.split(".")[0] for v in sent["versions"].values()] == [major, str(int(major) - 3)]  # ai, @ai-sdk/react
    assert sent["status"] == "ready" and sent["error"] is None and roles(sent) == ["user", "assistant"]
    assert text(sent["messages"][1]) == WHOLE
    answer = latest_answer("whole")
    assert sent["messages"][1]["id"] == aisdk.message_id(answer.id) and answer.is_closed
    # A page opened after the end renders the conversation and resumes: the answer is replayed
    # under its id, so it replaces the one rendered instead of showing twice.
    again = sdk(demo_server, chat_client, "whole", "resume", messages=sent["messages"])
    assert again["status"] == "ready" and roles(again) == ["user", "assistant"] and text(again["messages"][1]) == WHOLE
    print(f"a whole answer: {sent['deltas']} deltas; replayed after its end: {again['deltas']}")


def test_a_reload_mid_answer_resumes_it_from_postgres_with_nothing_lost_or_twice(demo_server: str, chat_client) -> None:
    cut = sdk(demo_server, chat_client, "reload", "send", prompt=PROMPT, disconnectAfter=5)
    # Over the socket, the transport's close() fails the request it cut (a page that reloads sees nothing).
    ended = (
        ("error", "WebSocket chat transport was closed.")
        if chat_client["transport"] == "websocket"
        else ("ready", None)
    )
    assert (cut["status"], cut["error"]) == ended and 5 <= len(text(cut["messages"][1])) < len(WHOLE)
    # The page reloads: it renders what it had (or only the prompt) and resumes.
    with_partial = start(demo_server, chat_client, "reload", "resume", messages=cut["messages"])
    prompt_only = sdk(demo_server, chat_client, "reload", "resume", messages=cut["messages"][:1])
    resumed = json.loads(with_partial.communicate(timeout=90)[0].splitlines()[-1])
    for result in (resumed, prompt_only):
        assert result["status"] == "ready" and roles(result) == ["user", "assistant"]
        assert text(result["messages"][1]) == WHOLE
        assert result["messages"][1]["id"] == cut["messages"][1]["id"]
    print(f"cut after {cut['deltas']} deltas ({len(text(cut['messages'][1]))} characters), resumed whole twice")


def test_two_tabs_of_one_chat_each_get_the_whole_answer(demo_server: str, chat_client) -> None:
    first = start(demo_server, chat_client, "tabs", "send", prompt=PROMPT)
    deadline = time.monotonic() + 20
    while not Conversation.objects.filter(chat_id="tabs").exists():  # bounded: the answer's stream exists
        assert time.monotonic() < deadline, "the first tab's prompt never arrived"
        time.sleep(0.05)
    second = sdk(demo_server, chat_client, "tabs", "resume", messages=[])
    first_result = json.loads(first.communicate(timeout=90)[0].splitlines()[-1])
    assert roles(first_result) == ["user", "assistant"] and text(first_result["messages"][1]) == WHOLE
    assert roles(second) == ["assistant"] and text(second["messages"][0]) == WHOLE


def test_a_stop_keeps_the_partial_answer_and_a_reload_shows_the_same(demo_server: str, chat_client) -> None:
    stopped = sdk(demo_server, chat_client, "stop", "send", prompt=PROMPT, stopAfter=5)
    assert stopped["stop"] == {"stopped": True} and stopped["status"] == "ready" and stopped["error"] is None
    partial = text(stopped["messages"][1])
    assert 5 <= len(partial) < len(WHOLE)
    answer = latest_answer("stop")
    stored = kinds(answer)
    assert stored[-1] == "abort" and "finish" not in stored and answer.is_closed
    time.sleep(0.5)  # the generator, stopped at its next word, writes nothing more
    assert kinds(answer) == stored
    reloaded = sdk(demo_server, chat_client, "stop", "resume", messages=stopped["messages"][:1])
    assert roles(reloaded) == ["user", "assistant"] and text(reloaded["messages"][1]) == partial
    headers = {"Cookie": chat_client["cookie"], "X-CSRFToken": CSRF}
    again = httpx.post(f"http://{demo_server}{chat_client['api']}/stop/stop", headers=headers)
    assert again.json() == {"stopped": False} and kinds(answer) == stored
    print(f"stopped after {len(partial)} of {len(WHOLE)} characters; {len(stored)} parts stored")


def writing(chat: str, spawn) -> tuple[Stream, subprocess.Popen[str]]:
    """An answer of the chat being written by another process (``tests.workers answer``), once
    it has begun."""
    user = get_user_model().objects.get(username="aisdk-user")
    answer = aisdk.create_answer(owner=user, path=f"chat/{chat}")
    Conversation.objects.create(user=user, prompt=PROMPT, stream=answer, chat_id=chat)
    writer = spawn("answer", "--stream", str(answer.id), "--count", "1000", "--pause", "0.05")
    assert writer.stdout.readline().strip() == "writing"
    return answer, writer


def killed_mid_answer(server: str, options: dict[str, str], chat: str, spawn) -> float:
    """Kill an answer's writing process while the SDK's client reads it; check that the client
    ends with the answer so far and the lease's error part, and return how long after the kill."""
    answer, writer = writing(chat, spawn)
    reader = start(server, options, chat, "resume", messages=[])
    time.sleep(1.0)
    writer.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    result = json.loads(reader.communicate(timeout=90)[0].splitlines()[-1])
    ended = time.monotonic() - killed
    assert result["status"] == "error" and result["error"] == aisdk.ABANDONED_TEXT
    assert roles(result) == ["assistant"] and text(result["messages"][0]).startswith("word0 word1 ")
    assert kinds(answer)[-1] == "error"
    return ended


def test_an_answer_whose_generating_process_was_killed_ends_with_an_error_part(demo_server, session, spawn) -> None:
    ended = killed_mid_answer(demo_server, session, "killed", spawn)
    print(f"read through pgstreams.aisdk.response, the dead writer's answer ended {ended:.1f} s later")
    assert ended < aisdk.LEASE + 2 * aisdk.HEARTBEAT + 5  # the how-to's bound, and a margin


def test_through_the_durable_streams_transport_a_dead_writers_answer_ends_with_an_error_part(
    demo_server, session, spawn
) -> None:
    ended = killed_mid_answer(demo_server, {**session, **ROUTES["durable-streams"]}, "killed-durable", spawn)
    print(f"read through the Durable Streams endpoint, the dead writer's answer ended {ended:.1f} s later")
    assert ended < aisdk.LEASE + 2 * durable_views.KEEPALIVE + 5


def test_a_chat_with_no_answer_resumes_to_nothing(demo_server: str, chat_client) -> None:
    nothing = sdk(demo_server, chat_client, "empty", "resume", messages=[])
    assert nothing["status"] == "ready" and nothing["messages"] == [] and nothing["deltas"] == 0


async def test_the_demos_chat_endpoints_answer_json_nested_too_deeply_as_bad_json() -> None:
    """Python's parser gives up on deep nesting with RecursionError, which answered 500."""
    user = await sync_to_async(get_user_model().objects.create_user)("deep", password="pw")
    client = AsyncClient()
    await client.aforce_login(user)
    deep = "[" * 100_000 + "]" * 100_000
    for path in ("/ai/chat", "/ai/durable/chat"):
        answer = await client.post(path, deep, content_type="application/json")
        assert answer.status_code == 400 and b"must be JSON" in answer.content, path
    stop = await client.post("/ai/chat/deep/stop", deep, content_type="application/json")
    assert stop.status_code == 200 and stop.json() == {"stopped": False}


def howto_files() -> dict[str, str]:
    """The AI SDK how-to's example: each Python block whose first line names its file."""
    howto = (ROOT / "docs" / "howto" / "ai-sdk.md").read_text()
    section = howto.split("\n## Behind a proxy", 1)[0]
    files = {}
    for block in re.findall(r"```python\n(.*?)```", section, re.S):
        named = re.match(r"# (\S+\.py)", block)
        assert named, f"a Python block of the AI SDK how-to names no file: {block[:60]!r}"
        files[named[1]] = block
    return files


def test_a_project_made_from_the_howto_alone_serves_an_answer_to_the_sdk_client(tmp_path, session) -> None:
    files = howto_files()
    assert set(files) == {
        "mysite/settings.py",
        "mysite/asgi.py",
        "mysite/urls.py",
        "chat/llm.py",
        "chat/sockets.py",
        "chat/views.py",
    }
    # The test's secret: its session was signed with it.
    env = make_project(tmp_path, files, f"SECRET_KEY = {settings.SECRET_KEY!r}")
    port = free_port()
    command = [sys.executable, "-m", "daphne", "-v", "0", "-b", "127.0.0.1", "-p", str(port), "mysite.asgi:application"]
    over = {"http": {"api": "/api/chat"}, "websocket": {"transport": "websocket", "socket": "/ws/chat/"}}
    with serving(command, port, env=env, cwd=tmp_path) as server:
        for transport, options in over.items():
            chat = f"readme-{transport}"
            sent = sdk(server, session, chat, "send", prompt=f"hello over {transport}", **options)
            resumed = sdk(server, session, chat, "resume", messages=sent["messages"][:1], **options)
            assert sent["status"] == "ready" and roles(sent) == ["user", "assistant"], transport
            assert text(sent["messages"][1]) == f"You said: hello over {transport} "
            assert roles(resumed) == ["user", "assistant"] and text(resumed["messages"][1]) == text(sent["messages"][1])


# -- useChat in Chromium ---------------------------------------------------------------------------

OTHER = "And what does the poll cost?"


# The demo page's transports: ai 7 over its chat socket (the default), ai 7 over HTTP, ai 6 over HTTP.
PAGES = {"websocket": "", "http": "?transport=http", "http-ai6": "?sdk=6"}


@pytest.fixture(params=on_each_sdk(list(PAGES)))
def page_query(request) -> str:
    return PAGES[request.param]


def open_chat(page, host: str, query: str = "") -> str:
    """Sign in as the demo's user and open a new AI SDK chat on the page's transport; returns its
    page's URL."""
    page.goto(f"http://{host}/accounts/login/")
    page.fill("#id_username", "demo")
    page.fill("#id_password", "demo")
    page.click("form.login button")
    if query:
        page.goto(f"http://{host}/ai/{query}")
    else:
        page.click("#ai-chat-link")
    page.wait_for_selector("#ai-status[data-state=ready]")
    return page.url


def ask(page, prompt: str) -> None:
    page.fill("#ai-prompt", prompt)
    page.click("#ai-send")


def answers(page) -> list[str]:
    return page.eval_on_selector_all("li[data-role=assistant]", "items => items.map((item) => item.textContent)")


def wait_for_answers(page, count: int, length: int = 0) -> None:
    page.wait_for_function(
        f"[...document.querySelectorAll('li[data-role=assistant]')].length === {count} && "
        f"document.querySelectorAll('li[data-role=assistant]')[{count - 1}].textContent.length > {length}"
    )


def stored_text(chat: str) -> str:
    answer = latest_answer(chat)
    return "".join(p["delta"] for p in parts(answer) if p["type"] == "text-delta")


def test_use_chat_in_chromium_answers_several_prompts_resumes_a_reload_and_shows_each_answer_once(
    demo_server, page, page_query
) -> None:
    open_chat(page, demo_server, page_query)
    ask(page, PROMPT)
    wait_for_answers(page, 1, 20)
    page.reload()  # mid-answer: useChat resumes it from Postgres
    page.wait_for_selector("#ai-status[data-state=ready]")
    wait_for_answers(page, 1, len(WHOLE) - 1)
    assert answers(page) == [WHOLE]
    ask(page, OTHER)
    page.wait_for_selector("#ai-status[data-state=streaming]")
    page.wait_for_selector("#ai-status[data-state=ready]")
    assert answers(page) == [WHOLE, "".join(llm.answer(OTHER))]
    page.reload()  # after the end: the first answer from its stored parts, the second replayed
    wait_for_answers(page, 2, len("".join(llm.answer(OTHER))) - 1)
    page.wait_for_selector("#ai-status[data-state=ready]")
    assert answers(page) == [WHOLE, "".join(llm.answer(OTHER))]
    assert page.eval_on_selector_all("li[data-role=user]", "items => items.map((item) => item.textContent)") == [
        PROMPT,
        OTHER,
    ]


def second_tab(page, url: str):
    """Another browser context with the same session, on ``url``."""
    context = page.context.browser.new_context(viewport={"width": 390, "height": 844})
    context.add_cookies(page.context.cookies())
    tab = context.new_page()
    tab.goto(url)
    return tab


def test_use_chat_in_a_second_tab_follows_the_same_answer(demo_server, page, page_query) -> None:
    url = open_chat(page, demo_server, page_query)
    ask(page, PROMPT)
    wait_for_answers(page, 1, 20)
    second = second_tab(page, url)
    for tab in (page, second):
        wait_for_answers(tab, 1, len(WHOLE) - 1)
        tab.wait_for_selector("#ai-status[data-state=ready]")
        assert answers(tab) == [WHOLE]


def test_use_chat_stop_in_chromium_ends_the_answer_for_both_tabs_and_a_reload_shows_what_was_stored(
    demo_server, page, page_query
) -> None:
    """Over HTTP the page's Stop posts the demo's stop endpoint and reads on to the abort part:
    it shows what was stored. Over the socket it is useChat's stop(): an abort frame, which ends
    the answer for every reader, and the page drops at once what was still in flight, so it shows
    a prefix of what was stored (the words written during the abort's round trip), which the
    other tab and a reload show whole."""
    url = open_chat(page, demo_server, page_query)
    chat = urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1]
    ask(page, PROMPT)
    wait_for_answers(page, 1, 20)
    second = second_tab(page, url)
    wait_for_answers(second, 1, 20)
    second.click("#ai-stop")  # in the tab that only follows the answer
    for tab in (second, page):
        tab.wait_for_selector("#ai-status[data-state=ready]")
    page.wait_for_timeout(500)  # nothing more comes: the answer was ended, not only disconnected
    stored = in_thread(lambda: stored_text(chat))
    assert in_thread(lambda: kinds(latest_answer(chat)))[-1] == "abort" and 20 < len(stored) < len(WHOLE)
    assert answers(page) == [stored]
    if page_query:  # over HTTP: the tab that stopped read on to the abort
        assert answers(second) == [stored]
    else:
        assert stored.startswith(answers(second)[0])
    second.reload()
    wait_for_answers(second, 1, len(stored) - 1)
    second.wait_for_selector("#ai-status[data-state=ready]")
    assert answers(second) == [stored]


def test_use_chat_in_chromium_shows_the_error_of_an_answer_whose_writer_was_killed(demo_server, page, spawn) -> None:
    user = in_thread(lambda: get_user_model().objects.get(username="demo"))
    answer = in_thread(lambda: aisdk.create_answer(owner=user))
    in_thread(lambda: Conversation.objects.create(user=user, prompt=PROMPT, stream=answer, chat_id="killed-tab"))
    writer = spawn("answer", "--stream", str(answer.id), "--count", "1000", "--pause", "0.05")
    assert writer.stdout.readline().strip() == "writing"
    open_chat(page, demo_server)
    page.goto(f"http://{demo_server}/ai/c/killed-tab/")
    wait_for_answers(page, 1, 10)
    writer.send_signal(signal.SIGKILL)
    page.wait_for_selector("#ai-status[data-state=error]", timeout=(aisdk.LEASE + 2 * aisdk.HEARTBEAT + 10) * 1000)
    assert aisdk.ABANDONED_TEXT in page.inner_text("#ai-status")
    assert answers(page)[0].startswith("word0 word1 ")


def test_the_vendored_page_is_what_its_source_and_the_pinned_packages_build(tmp_path) -> None:
    node = node_dir()
    env = {**os.environ, "AISDK_VENDOR_DIR": str(tmp_path)}
    subprocess.run(["node", "vendor_aisdk.mjs"], cwd=node, env=env, check=True, capture_output=True, timeout=120)
    vendored = ROOT / "demo_project" / "chat" / "static" / "chat" / "vendor"
    for name in ("aisdk-chat.js", "aisdk-chat.LICENSES.txt", "aisdk-chat-6.js", "aisdk-chat-6.LICENSES.txt"):
        fresh, kept = (tmp_path / name).read_bytes(), (vendored / name).read_bytes()
        assert fresh == kept, f"{name} is not what node/aisdk_page.jsx builds: cd node && npm run vendor-aisdk"


PROMPTS = st.text(st.characters(exclude_categories=()), max_size=40) | st.sampled_from(["a\x00b", "\ud800", "ok\udfff"])


@examples(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=PROMPTS)
def test_any_prompt_to_the_demos_chat_endpoints_is_answered_or_refused_with_a_reason_never_a_500(
    prompt: str, client_of_prompts: Client
) -> None:
    """NUL characters and lone surrogates answered 500 (DataError, UnicodeEncodeError) with
    nothing written; any text is started as an answer or refused with a 400 that says why."""
    body = {"id": "hostile", "messages": [{"role": "user", "parts": [{"type": "text", "text": prompt}]}]}
    streams = Stream.objects.count()
    reply = client_of_prompts.post("/ai/chat", json.dumps(body), content_type="application/json")
    if reply.status_code == 400:
        assert reply.content.strip() and Stream.objects.count() == streams
    else:
        assert reply.status_code == 200 and Stream.objects.count() == streams + 1
        reply.close()
    if not (usable := prompt.encode("utf-8", "surrogatepass").decode("utf-8", "replace")):
        return
    page = client_of_prompts.post("/", {"prompt": usable})  # the chat form: a form post is UTF-8
    assert page.status_code in (200, 302)
    if page.status_code == 200:
        assert b'<p class="error">' in page.content  # why it was refused


@pytest.fixture
def client_of_prompts() -> Iterator[Client]:
    """A signed-in client; the answers its prompts started, which the module's demo workers write,
    are ended before the test's flush (a worker's transaction can deadlock the flush's TRUNCATE)."""
    client = Client()
    client.force_login(get_user_model().objects.get_or_create(username="prompts")[0])
    yield client
    end_answers_in_flight()
