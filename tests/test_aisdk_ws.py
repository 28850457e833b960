"""``pgstreams.aisdk_ws.ChatConsumer`` through Channels' WebsocketCommunicator, frame by frame as ai
7's ``WebSocketChatTransport`` sends and reads them: an answer's parts as chunk frames numbered by
their offsets, resume from the first part or after ``lastSequence``, several requests on one
socket, an abort that stops the answer for every reader and a closed socket that stops none, and
every kind of bad frame answered with an error that says why and nothing started. The SDK's own
clients against the demo's chat socket are in test_aisdk.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.urls import path
from prometheus_client import REGISTRY

import pgstreams
from demo_project.servers import server_command
from pgstreams import aisdk, aisdk_ws
from pgstreams.models import Chunk, Stream
from tests.conftest import serving
from tests.helpers import RawWebSocket, free_port

pytestmark = pytest.mark.django_db(transaction=True)

WORDS = [f"w{i} " for i in range(12)]


async def words(pause: float = 0.02) -> AsyncIterator[str]:
    for word in WORDS:
        await asyncio.sleep(pause)
        yield word


class Chats(aisdk_ws.ChatConsumer):
    """A project's subclass, as small as one can be: a send writes ``WORDS`` to a new answer, in
    this process; a resume replays the chat's latest answer. ``chats`` maps a chat id to its
    answers, ``pause`` is the time between two words, ``starting`` the time a send takes to start
    its answer."""

    chats: dict[str, list[uuid.UUID]] = {}
    pause = 0.02
    starting = 0.0

    async def start_answer(self, request: aisdk_ws.ChatRequest) -> Any:
        if request.messages[-1]["parts"][0].get("text") == "refuse me":
            raise aisdk_ws.RequestRefused("this prompt is refused")
        await asyncio.sleep(self.starting)
        answer = await aisdk.acreate_answer(owner=self.scope["user"])
        aisdk.start_answer(answer.id, words(self.pause))
        self.chats.setdefault(request.chat_id, []).append(answer.id)
        return answer

    async def latest_answer(self, request: aisdk_ws.ChatRequest) -> Any:
        return self.chats.get(request.chat_id, [None])[-1]


@pytest.fixture
def user() -> Any:
    Chats.chats = {}
    Chats.starting = 0.0
    return get_user_model().objects.create_user("ws-chat-user")


async def connect(user: Any, consumer: type[aisdk_ws.ChatConsumer] = Chats) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(URLRouter([path("ws/chat/", consumer.as_asgi())]), "/ws/chat/")
    communicator.scope["user"] = user
    connected, _ = await communicator.connect()
    assert connected
    return communicator


def send(request_id: str, chat: str = "c1", text: str = "hello", **frame: Any) -> dict[str, Any]:
    """A send frame as the transport makes it."""
    message = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": text}]}
    return {
        "type": "send",
        "requestId": request_id,
        "id": chat,
        "trigger": "submit-message",
        "messageId": None,
        "messages": [message],
        "headers": {},
        "body": {},
        "metadata": None,
        **frame,
    }


def resume(request_id: str, chat: str = "c1", **frame: Any) -> dict[str, Any]:
    return {"type": "resume", "requestId": request_id, "id": chat, "headers": {}, "body": {}, **frame}


async def frames_until(communicator: WebsocketCommunicator, done: Any, timeout: float = 10) -> list[dict[str, Any]]:
    """The frames received until ``done(frame)`` holds for one (bounded by ``timeout``)."""
    got = []
    async with asyncio.timeout(timeout):
        while True:
            frame = json.loads(await communicator.receive_from(timeout))
            got.append(frame)
            if done(frame):
                return got


async def drain(communicator: WebsocketCommunicator, quiet: float = 0.3) -> list[dict[str, Any]]:
    """The frames received until none came for ``quiet`` seconds (bounded: at most 200)."""
    got = []
    for _ in range(200):
        if await communicator.receive_nothing(quiet):
            return got
        got.append(json.loads(await communicator.receive_from()))
    raise AssertionError("frames kept coming")


def ended(request_id: str):
    return lambda frame: frame["requestId"] == request_id and frame["type"] in ("end", "error", "no-active")


@sync_to_async
def stored(stream_id: Any) -> list[dict[str, Any]]:
    rows = Chunk.objects.filter(stream_id=stream_id).order_by("offset").values_list("data", flat=True)
    return [json.loads(data) for data in rows]


async def test_a_send_streams_the_answers_parts_as_chunk_frames_numbered_by_their_offsets_then_end(user) -> None:
    ws = await connect(user)
    await ws.send_json_to(send("r1"))
    got = await frames_until(ws, ended("r1"))
    await ws.disconnect()
    answer = Chats.chats["c1"][0]
    parts = await stored(answer)
    assert got[0] == {"type": "start", "requestId": "r1"} and got[-1] == {"type": "end", "requestId": "r1"}
    chunks = got[1:-1]
    assert [f["sequence"] for f in chunks] == list(range(len(parts)))
    assert [f["chunk"] for f in chunks] == parts and parts[-1] == {"type": "finish"}
    assert "".join(p["delta"] for p in parts if p["type"] == "text-delta") == "".join(WORDS)


async def test_a_resume_replays_the_answer_from_its_first_part_or_after_the_last_sequence_given(user) -> None:
    ws = await connect(user)
    await ws.send_json_to(send("r1"))
    whole = await frames_until(ws, ended("r1"))
    await ws.send_json_to(resume("r2"))
    replayed = await frames_until(ws, ended("r2"))
    await ws.send_json_to(resume("r3", lastSequence=4))
    after = await frames_until(ws, ended("r3"))
    await ws.send_json_to(resume("r4", chat="no-such-chat"))
    nothing = await frames_until(ws, ended("r4"))
    await ws.disconnect()
    chunks = [f["chunk"] for f in whole if f["type"] == "chunk"]
    assert [f["chunk"] for f in replayed if f["type"] == "chunk"] == chunks
    assert [f["sequence"] for f in after if f["type"] == "chunk"] == list(range(5, len(chunks)))
    assert nothing == [{"type": "no-active", "requestId": "r4"}]


async def test_a_resume_mid_answer_follows_it_live_to_its_end(user) -> None:
    Chats.pause = 0.1
    try:
        first = await connect(user)
        await first.send_json_to(send("r1"))
        await frames_until(first, lambda f: f.get("sequence") == 5)
        second = await connect(user)
        await second.send_json_to(resume("r1"))  # another socket: the same requestId is its own
        followed = await frames_until(second, ended("r1"))
        rest = await frames_until(first, ended("r1"))
    finally:
        Chats.pause = 0.02
    await first.disconnect()
    await second.disconnect()
    assert followed[-1]["type"] == "end" and rest[-1]["type"] == "end"
    parts = await stored(Chats.chats["c1"][0])
    assert [f["chunk"] for f in followed if f["type"] == "chunk"] == parts


def chat_requests() -> float:
    return REGISTRY.get_sample_value("pgstreams_chat_requests")


async def test_two_chats_on_one_socket_are_served_at_once_each_whole_and_in_order(user) -> None:
    before = chat_requests()
    ws = await connect(user)
    await ws.send_json_to(send("a", chat="one"))
    await ws.send_json_to(send("b", chat="two"))
    got = await frames_until(ws, lambda f: f.get("sequence") == 1)  # both started (a's first)
    answering = chat_requests()
    got += await frames_until(ws, lambda f: f["type"] == "end" and f["requestId"] == "b")
    if not any(f["type"] == "end" and f["requestId"] == "a" for f in got):
        got += await frames_until(ws, ended("a"))
    await ws.disconnect()
    assert answering - before >= 1 and chat_requests() == before
    for request_id, chat in (("a", "one"), ("b", "two")):
        mine = [f for f in got if f["requestId"] == request_id and f["type"] == "chunk"]
        assert [f["sequence"] for f in mine] == list(range(len(mine)))
        assert [f["chunk"] for f in mine] == await stored(Chats.chats[chat][0])
    first_b = next(i for i, f in enumerate(got) if f["requestId"] == "b" and f["type"] == "chunk")
    last_a = max(i for i, f in enumerate(got) if f["requestId"] == "a" and f["type"] == "chunk")
    assert first_b < last_a  # interleaved: neither waited for the other


async def test_an_abort_stops_the_answer_for_every_reader_and_a_closed_socket_stops_none(user) -> None:
    Chats.pause = 0.1
    try:
        closing = await connect(user)
        await closing.send_json_to(send("kept", chat="kept"))
        await frames_until(closing, lambda f: f.get("sequence") == 4)
        await closing.disconnect()  # a reload: the answer goes on
        stopping = await connect(user)
        await stopping.send_json_to(send("r1", chat="stopped"))
        await frames_until(stopping, lambda f: f.get("sequence") == 4)
        follower = await connect(user)
        await follower.send_json_to(resume("r9", chat="stopped"))
        await frames_until(follower, lambda f: f.get("sequence") == 4)
        await stopping.send_json_to({"type": "abort", "requestId": "r1"})
        told = await frames_until(follower, ended("r9"))
        late = await drain(stopping)  # sent before the abort was read
        await stopping.disconnect()
        await follower.disconnect()
        kept = Chats.chats["kept"][0]
        for _ in range(100):  # bounded: the kept answer finishes on its own
            if (await stored(kept))[-1]["type"] == "finish":
                break
            await asyncio.sleep(0.1)
    finally:
        Chats.pause = 0.02
    stopped = await stored(Chats.chats["stopped"][0])
    assert stopped[-1] == {"type": "abort", "reason": "stopped by the user"} and "finish" not in str(stopped)
    assert [f["chunk"] for f in told if f["type"] == "chunk"][-1] == stopped[-1] and told[-1]["type"] == "end"
    assert all(f["type"] == "chunk" and f["sequence"] < len(stopped) - 1 for f in late)  # no abort part, no end
    assert (await stored(kept))[-1] == {"type": "finish"}


async def test_an_abort_whose_stop_is_under_way_when_the_consumer_is_cancelled_still_stops_the_answer(
    user, monkeypatch
) -> None:
    """A server shutting down (or a client given up) cancels the consumer while an abort's stop
    is being written: the stop goes on, and the answer ends with it for every reader."""
    real, entered = aisdk.astop, asyncio.Event()

    async def slow_stop(*args: Any, **kwargs: Any) -> bool:
        entered.set()
        await asyncio.sleep(0.2)  # a slow round trip to Postgres
        return await real(*args, **kwargs)

    monkeypatch.setattr(aisdk, "astop", slow_stop)
    Chats.pause = 0.1
    try:
        ws = await connect(user)
        await ws.send_json_to(send("r1"))
        await frames_until(ws, lambda f: f.get("sequence") == 4)
        await ws.send_json_to({"type": "abort", "requestId": "r1"})
        await asyncio.wait_for(entered.wait(), 10)
        ws.future.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ws.future
        answer = Chats.chats["c1"][0]
        for _ in range(50):  # bounded: the stop, or the answer's finish, comes within seconds
            if (await stored(answer))[-1]["type"] in ("abort", "finish"):
                break
            await asyncio.sleep(0.1)
    finally:
        Chats.pause = 0.02
    parts = await stored(answer)
    assert parts[-1] == {"type": "abort", "reason": "stopped by the user"} and "finish" not in str(parts)


async def test_an_abort_that_comes_while_the_answer_starts_stops_it_once_it_has(user) -> None:
    Chats.starting = 0.3
    ws = await connect(user)
    await ws.send_json_to(send("r1"))
    await asyncio.sleep(0.1)  # the answer is starting
    await ws.send_json_to({"type": "abort", "requestId": "r1"})
    assert await ws.receive_nothing(1.0)
    await ws.disconnect()
    parts = await stored(Chats.chats["c1"][0])
    assert parts and parts[-1]["type"] == "abort" and len(parts) < len(WORDS)


class StopsNothing(Chats):
    stop_on_abort = False


async def test_with_stop_on_abort_off_an_abort_only_stops_the_sending(user) -> None:
    ws = await connect(user, StopsNothing)
    await ws.send_json_to(send("r1"))
    await frames_until(ws, lambda f: f.get("sequence") == 4)
    await ws.send_json_to({"type": "abort", "requestId": "r1"})
    late = await drain(ws)
    await ws.send_json_to(resume("r2"))
    got = await frames_until(ws, ended("r2"))
    await ws.disconnect()
    assert all(f["type"] == "chunk" for f in late) and got[-2]["chunk"] == {"type": "finish"}


USER = {"id": "m1", "role": "user"}
BAD_SENDS = {
    "an unknown type": ({"type": "sned"}, "unknown frame type 'sned': send, resume or abort"),
    "no chat id": ({"id": ""}, "a send frame has an id: the chat's, a string of 1 to 128 characters"),
    "a chat id too long": ({"id": "c" * 129}, "a send frame has an id: the chat's, a string of 1 to 128 characters"),
    "a chat id with NUL": (
        {"id": "c\x00"},
        "a send frame has an id: the chat's, a string of 1 to 128 characters, none",
    ),
    "a chat id with a lone surrogate": ({"id": "c\ud800"}, "a send frame has an id: the chat's, a string"),
    "an unknown trigger": ({"trigger": "resume-stream"}, "trigger is one of submit-message, regenerate-message"),
    "a messageId not a string": ({"messageId": 7}, "messageId is a string, or left out"),
    "messages not a list": ({"messages": {}}, "messages is a list of UI messages, each an object with a role and"),
    "a message with no parts": ({"messages": [{"role": "user"}]}, "messages is a list of UI messages"),
    "headers not strings": ({"headers": {"a": 1}}, "headers is an object of strings"),
    "body not an object": ({"body": []}, "body is an object"),
    "a prompt the project refuses": (
        {"messages": [{"role": "user", "parts": [{"type": "text", "text": "refuse me"}]}]},
        "this prompt is refused",
    ),
    "a negative lastSequence": ({"type": "resume", "lastSequence": -1}, "lastSequence is a whole number of 0 or more"),
    "a lastSequence not a number": (
        {"type": "resume", "lastSequence": "3"},
        "lastSequence is a whole number of 0 or more",
    ),
}


@pytest.mark.parametrize("bad", list(BAD_SENDS))
async def test_a_bad_frame_gets_an_error_frame_saying_why_and_nothing_is_started(user, bad: str) -> None:
    change, why = BAD_SENDS[bad]
    streams = await Stream.objects.acount()
    ws = await connect(user)
    await ws.send_json_to(send("r1", **change))
    got = await frames_until(ws, ended("r1"))
    await ws.send_json_to(send("r2"))  # the socket still serves
    after = await frames_until(ws, ended("r2"))
    await ws.disconnect()
    assert len(got) == 1 and got[0]["type"] == "error" and got[0]["errorText"].startswith(why), got
    assert after[-1]["type"] == "end" and await Stream.objects.acount() == streams + 1


async def test_a_request_id_served_already_and_one_request_too_many_are_refused(user) -> None:
    Chats.pause = 0.1
    try:
        ws = await connect(user)
        await ws.send_json_to(send("r1"))
        await frames_until(ws, lambda f: f.get("sequence") == 1)  # the chat has its answer
        await ws.send_json_to(send("r1", chat="other"))
        twice = await frames_until(ws, lambda f: f["type"] == "error")
        for i in range(2, Chats.max_requests + 1):
            await ws.send_json_to(resume(f"r{i}"))
        await ws.send_json_to(resume("one-too-many"))
        many = await frames_until(ws, lambda f: f["type"] == "error")
    finally:
        Chats.pause = 0.02
    await ws.disconnect()
    assert twice[-1] == {"type": "error", "requestId": "r1", "errorText": "request 'r1' is being served already"}
    assert many[-1] == {"type": "error", "requestId": "one-too-many", "errorText": "at most 16 requests at once"}
    assert list(Chats.chats) == ["c1"]


REQUEST_ID_RULE = "a frame has a requestId: a string of 1 to 128 characters, none of them NUL or a lone surrogate"


@pytest.mark.parametrize(
    "frame, why",
    [
        ("not json", "a frame is one JSON object, as WebSocketChatTransport sends"),
        ('["send"]', REQUEST_ID_RULE),
        ('{"type": "send", "id": "c1"}', REQUEST_ID_RULE),
        (json.dumps(send("r" * 129)), REQUEST_ID_RULE),
        (json.dumps(send("r\x00")), REQUEST_ID_RULE),
        ("[" * 100_000 + "]" * 100_000, "a frame is one JSON object, as WebSocketChatTransport sends"),
        (json.dumps(send("r1", text="x" * (4 << 20))), "a frame is at most 4194304 characters"),
        (b"\x00binary", "binary frames are not accepted: send the transport's JSON"),
    ],
    ids=[
        "not JSON",
        "not an object",
        "no requestId",
        "a requestId too long",
        "a requestId with NUL",
        "nested too deeply",
        "too large",
        "binary",
    ],
)
async def test_a_frame_with_no_request_to_answer_closes_the_socket_with_4400_and_why(user, frame, why) -> None:
    streams = await Stream.objects.acount()
    ws = await connect(user)
    if isinstance(frame, bytes):
        await ws.send_to(bytes_data=frame)
    else:
        await ws.send_to(text_data=frame)
    closed = await ws.receive_output(5)
    assert closed == {"type": "websocket.close", "code": 4400, "reason": why}
    assert await Stream.objects.acount() == streams


class ReturnsAnyStream(Chats):
    """A subclass that gets its lookup wrong: it returns whatever stream the chat id names."""

    async def latest_answer(self, request: aisdk_ws.ChatRequest) -> Any:
        return request.chat_id


async def test_an_answer_the_user_may_not_read_is_refused_whatever_the_subclass_returned(user) -> None:
    other = await sync_to_async(get_user_model().objects.create_user)("someone-else")
    theirs = await aisdk.acreate_answer(owner=other)
    log = await pgstreams.acreate_stream(owner=user)  # readable, but not an answer
    ws = await connect(user, ReturnsAnyStream)
    await ws.send_json_to(resume("r1", chat=str(theirs.id)))
    refused = await frames_until(ws, ended("r1"))
    await ws.send_json_to(resume("r2", chat=str(log.id)))
    not_an_answer = await frames_until(ws, ended("r2"))
    await ws.disconnect()
    anonymous = await connect(AnonymousUser(), ReturnsAnyStream)
    await anonymous.send_json_to(resume("r3", chat=str(theirs.id)))
    anyone = await frames_until(anonymous, ended("r3"))
    await anonymous.disconnect()
    assert refused == [{"type": "error", "requestId": "r1", "errorText": "not allowed to read this answer"}]
    assert anyone == [{"type": "error", "requestId": "r3", "errorText": "not allowed to read this answer"}]
    assert not_an_answer[-1]["errorText"].startswith("the answer's stream holds no UI message parts")


class SlowToFind(ReturnsAnyStream):
    async def latest_answer(self, request: aisdk_ws.ChatRequest) -> Any:
        await asyncio.sleep(0.3)
        return request.chat_id


@pytest.mark.parametrize("content_type", ["text/plain", "application/json"])
async def test_an_abort_never_stops_a_stream_that_is_not_an_answer(user, content_type: str) -> None:
    """A resume aborted while its method ran stopped whatever stream the method returned once it
    had: a log the user may read was closed with an abort part (a JSON one too, until answers
    were marked as such when made)."""
    log = await pgstreams.acreate_stream(owner=user, content_type=content_type)
    await pgstreams.awrite(log.id, '"a line"')
    ws = await connect(user, SlowToFind)
    await ws.send_json_to(resume("r1", chat=str(log.id)))
    await asyncio.sleep(0.1)
    await ws.send_json_to({"type": "abort", "requestId": "r1"})
    await asyncio.sleep(0.5)
    await ws.disconnect()
    await log.arefresh_from_db()
    assert log.closed_at is None and await Chunk.objects.filter(stream=log).acount() == 1


async def test_an_abort_while_the_method_runs_keeps_the_request_counted_its_id_taken_and_its_frames_unsent(
    user,
) -> None:
    """An aborted request left the count while its method still ran (send and abort pairs
    started any number of answers at once), its id could be sent again, and the old request's
    late frames came under the new one's id."""
    Chats.starting = 0.5
    ws = await connect(user)
    for i in range(Chats.max_requests):
        await ws.send_json_to(send(f"r{i}", chat=f"c{i}"))
        await ws.send_json_to({"type": "abort", "requestId": f"r{i}"})
    await ws.send_json_to(send("r0", chat="again"))
    await ws.send_json_to(send("one-too-many", chat="many"))
    refused = await frames_until(ws, lambda f: f["requestId"] == "one-too-many")
    late = await drain(ws, quiet=1.0)  # the methods return: their answers are stopped, nothing sent
    await ws.disconnect()
    assert refused == [
        {"type": "error", "requestId": "r0", "errorText": "request 'r0' is being served already"},
        {"type": "error", "requestId": "one-too-many", "errorText": "at most 16 requests at once"},
    ]
    assert late == [] and sorted(Chats.chats) == sorted(f"c{i}" for i in range(Chats.max_requests))
    for answers in Chats.chats.values():
        assert (await stored(answers[0]))[-1]["type"] == "abort"


async def test_a_socket_closed_while_an_aborted_request_stops_its_answer_leaves_it_stopped(user, monkeypatch) -> None:
    """The close cancelled the stop of a request aborted while its method ran, once the method
    had returned: the answer went on to its finish."""
    stop = aisdk.astop

    async def slow_stop(*args: Any, **kwargs: Any) -> bool:
        await asyncio.sleep(0.3)  # a slow database
        return await stop(*args, **kwargs)

    monkeypatch.setattr(aisdk, "astop", slow_stop)
    Chats.starting, Chats.pause = 0.3, 0.2
    try:
        ws = await connect(user)
        await ws.send_json_to(send("r1"))
        await asyncio.sleep(0.1)
        await ws.send_json_to({"type": "abort", "requestId": "r1"})
        await asyncio.sleep(0.35)  # the method has returned; its stop is under way
        await ws.disconnect()
        await asyncio.sleep(1.0)
    finally:
        Chats.pause = 0.02
    parts = await stored(Chats.chats["c1"][0])
    assert parts[-1]["type"] == "abort"


async def test_a_consumer_cancelled_from_outside_after_a_refusal_is_cancelled() -> None:
    """After a 4400 close (or a failed send) the consumer swallowed any cancellation, as if it
    were its own giving up: a server shutting it down saw it end as though it had finished."""
    ws = await connect(AnonymousUser())
    await ws.send_to(bytes_data=b"binary")
    assert (await ws.receive_output(5))["code"] == 4400
    ws.future.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await ws.future
    assert ws.future.cancelled()


class SlowToStart(Chats):
    """The how-to's shape: the answer made, then (after a moment here) its writer started."""

    async def start_answer(self, request: aisdk_ws.ChatRequest) -> Any:
        answer = await aisdk.acreate_answer(owner=self.scope["user"])
        self.chats.setdefault(request.chat_id, []).append(answer.id)
        await asyncio.sleep(0.3)
        aisdk.start_answer(answer.id, words(self.pause))
        return answer


async def test_a_socket_closed_while_an_answer_starts_leaves_the_answer_started(user) -> None:
    """The request's cancellation cancelled the subclass's method between making the answer and
    starting its writer: an answer nobody wrote, and a resume that showed nothing for minutes."""
    ws = await connect(user, SlowToStart)
    await ws.send_json_to(send("r1"))
    await asyncio.sleep(0.1)
    await ws.disconnect()  # a reload while the answer starts
    answer = None
    for _ in range(50):  # bounded: 5 s
        if Chats.chats.get("c1") and (parts := await stored(Chats.chats["c1"][0])) and parts[-1]["type"] == "finish":
            answer = parts
            break
        await asyncio.sleep(0.1)
    assert answer is not None, "the answer was made but never written"


async def test_a_socket_that_has_carried_its_share_takes_no_new_request_and_is_closed(user) -> None:
    """Under daphne a send never waits: a client that resumed a long answer again and again and
    read nothing made the server hold all of it (458 MB from one socket in 16 s)."""

    class Small(Chats):
        max_socket_chars = 2000

    ws = await connect(user, Small)
    await ws.send_json_to(send("r1"))
    first = await frames_until(ws, ended("r1"))
    for i in range(2, 50):  # bounded: each resume replays the whole answer
        await ws.send_json_to(resume(f"r{i}"))
        output = await ws.receive_output(5)
        if output["type"] == "websocket.close":
            break
        await frames_until(ws, ended(f"r{i}"))
    assert first[-1]["type"] == "end" and i < 49
    assert output == {
        "type": "websocket.close",
        "code": 4429,
        "reason": "this socket has carried its share; open another",
    }


async def test_an_abort_stops_the_sending_of_a_stream_that_is_not_an_answer(user) -> None:
    """An abort of a request whose stream was no answer (nothing to stop) left it sending."""
    log = await pgstreams.acreate_stream(owner=user, content_type="application/json")
    await pgstreams.awrite_many(log.id, ['"one"', '"two"'])
    ws = await connect(user, ReturnsAnyStream)
    await ws.send_json_to(resume("r1", chat=str(log.id)))
    await frames_until(ws, lambda f: f.get("sequence") == 1)
    await ws.send_json_to({"type": "abort", "requestId": "r1"})
    await asyncio.sleep(0.2)
    await pgstreams.awrite(log.id, '"three"')
    late = await drain(ws, quiet=0.5)
    await ws.disconnect()
    await log.arefresh_from_db()
    assert late == [] and log.closed_at is None


class Fails(Chats):
    async def start_answer(self, request: aisdk_ws.ChatRequest) -> Any:
        raise RuntimeError("the project's bug, with a secret in it")


async def test_a_method_that_raises_gets_a_plain_error_frame_and_the_exception_is_logged(user, caplog) -> None:
    ws = await connect(user, Fails)
    await ws.send_json_to(send("r1"))
    got = await frames_until(ws, ended("r1"))
    await ws.disconnect()
    assert got == [{"type": "error", "requestId": "r1", "errorText": aisdk_ws.FAILED_TEXT}]
    assert "the project's bug" in caplog.text


# -- a client that reads nothing, against a real server ------------------------------------------

# The benchmark's application (its chat socket resumes a chat whose id is a stream's) under
# uvicorn, with SEND_TIMEOUT from the environment and one more route: GET /test/chats/ answers how
# many of the chat socket's requests the server process is serving, and the exceptions that left
# the application (each one uvicorn logs as an error).
CHATS_SERVER = """
import asyncio, json, os, sys
from bench.chat_asgi import application as bench
from pgstreams import aisdk_ws
aisdk_ws.SEND_TIMEOUT = float(os.environ["TEST_SEND_TIMEOUT"])
escaped = []

async def application(scope, receive, send):
    if scope["type"] == "http" and scope["path"] == "/test/chats/":
        tasks = [t for t in asyncio.all_tasks() if t.get_name().startswith("pgstreams-aisdk-ws-") and not t.done()]
        body = json.dumps({"requests": len(tasks), "escaped": escaped}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
        return
    try:
        await bench(scope, receive, send)
    except BaseException as exc:
        escaped.append(type(exc).__name__)
        raise

from uvicorn.main import main
main(sys.argv[1:])
"""


async def big_answer(parts: int) -> Any:
    """An ownerless answer of ``parts`` parts of 60 KB each, ended."""
    answer = await pgstreams.acreate_stream(content_type="application/json")
    for start in range(0, parts, 50):
        batch = range(start, min(start + 50, parts))
        await pgstreams.awrite_many(answer.id, [json.dumps(f"{i:05}" + "x" * 60_000) for i in batch])
    await pgstreams.aclose(answer.id)
    return answer


@contextlib.asynccontextmanager
async def chats_server(send_timeout: float) -> AsyncIterator[tuple[str, Any]]:
    """``CHATS_SERVER`` on a free loopback port: its host and a function that answers its state."""
    port = free_port()
    command = [sys.executable, "-c", CHATS_SERVER, *server_command("uvicorn", "__main__:application", port)[3:]]
    with serving(command, port, env={"TEST_SEND_TIMEOUT": str(send_timeout)}) as host:
        async with httpx.AsyncClient(timeout=10) as http:

            async def state() -> dict[str, Any]:
                return (await http.get(f"http://{host}/test/chats/")).json()

            yield host, state


@pytest.mark.multiprocess
@pytest.mark.parametrize("requests", [1, 8])
async def test_a_client_that_reads_nothing_is_given_up_after_the_send_timeout_once(requests: int) -> None:
    """uvicorn's sends wait while its client reads nothing: the requests waiting on them are
    given up once SEND_TIMEOUT passes, and the server holds nothing of them. With several, each
    cancelled the consumer again and the second cancellation left the application as an error."""
    answer = await big_answer(400)  # 24 MB
    async with chats_server(1) as (host, state):
        client = await asyncio.to_thread(RawWebSocket, host, "/ws/bench/chat/")  # reads nothing
        try:
            for i in range(requests):
                client.send_text(json.dumps(resume(f"r{i}", chat=str(answer.id)), separators=(",", ":")))
            counts = []
            for _ in range(100):  # bounded: 10 s
                counts.append((await state())["requests"])
                if counts[-1] == 0 and requests in counts:
                    break
                await asyncio.sleep(0.1)
        finally:
            client.close()
        escaped = (await state())["escaped"]
    assert requests in counts and counts[-1] == 0, counts  # served, then given up
    assert escaped == []


def slow_server(application: Any, seconds: float) -> Any:
    """``application`` under a server whose every WebSocket send takes ``seconds`` (as uvicorn's
    do while a client reads at a steady, slow pace)."""

    async def slowed(scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def slow_send(message: dict[str, Any]) -> None:
            if message["type"] == "websocket.send":
                await asyncio.sleep(seconds)
            await send(message)

        await application(scope, receive, slow_send)

    return slowed


async def test_a_client_that_takes_frames_at_a_steady_pace_is_not_given_up(user, monkeypatch) -> None:
    """A request given up when a whole batch had not gone within SEND_TIMEOUT, though its client
    took a frame every fraction of it."""
    monkeypatch.setattr(aisdk_ws, "SEND_TIMEOUT", 0.5)
    answer = await aisdk.acreate_answer(owner=user)
    await pgstreams.awrite_many(answer.id, [json.dumps({"type": "data-n", "data": i}) for i in range(12)])
    await pgstreams.aclose(answer.id)
    Chats.chats["c1"] = [answer.id]
    application = slow_server(URLRouter([path("ws/chat/", Chats.as_asgi())]), 0.1)  # 12 parts: 1.2 s
    ws = WebsocketCommunicator(application, "/ws/chat/")
    ws.scope["user"] = user
    assert (await ws.connect())[0]
    await ws.send_json_to(resume("r1"))
    got = await frames_until(ws, ended("r1"))
    await ws.disconnect()
    assert [f["sequence"] for f in got if f["type"] == "chunk"] == list(range(12)) and got[-1]["type"] == "end"


@pytest.mark.parametrize("origin, accepted", [(b"http://evil.example", False), (b"http://127.0.0.1", True)])
async def test_the_demos_chat_socket_refuses_a_foreign_origin(origin: bytes, accepted: bool) -> None:
    from demo_project.asgi import application

    headers = [(b"origin", origin), (b"host", b"127.0.0.1")]
    communicator = WebsocketCommunicator(application, "/ws/ai/chat/", headers=headers)
    connected, _ = await communicator.connect()
    assert connected is accepted
    if connected:
        await communicator.disconnect()
