"""The WebSocket consumer through Channels' WebsocketCommunicator: protocol, resume, close codes,
authorization, flow control and bad client frames; then under a real server (daphne, uvicorn):
hostile client frames and a client that reads nothing, and what the server holds after them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets
from asgiref.sync import sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.db import connection
from django.test import override_settings

import pgstreams
from demo_project.servers import server_command
from pgstreams import consumers
from pgstreams.models import Chunk
from pgstreams.routing import websocket_urlpatterns
from tests.conftest import serving
from tests.helpers import RawWebSocket, delete_chunks, free_port

pytestmark = pytest.mark.django_db(transaction=True)

router = URLRouter(websocket_urlpatterns)


async def connect(stream_id: Any, query: str = "", user: Any = None) -> WebsocketCommunicator:
    path = f"/ws/pgstreams/{stream_id}/" + (f"?{query}" if query else "")
    communicator = WebsocketCommunicator(router, path)
    communicator.scope["user"] = user or AnonymousUser()
    connected, _ = await communicator.connect()
    assert connected
    return communicator


async def receive_all(
    communicator: WebsocketCommunicator, timeout: float = 5, ack: bool = True
) -> tuple[list[dict], int]:
    """Every frame until the socket closes, acknowledging chunks as a client does (unless
    ``ack`` is false); returns (frames, close code)."""
    frames = []
    while True:
        message = await communicator.receive_output(timeout)
        if message["type"] == "websocket.close":
            return frames, message.get("code", 1000)
        frames.append(json.loads(message["text"]))
        if ack and frames[-1]["type"] == "chunks":
            await communicator.send_json_to({"type": "ack", "frame": frames[-1]["frame"]})


def offsets(frames: list[dict]) -> list[tuple[int, str]]:
    return [(i["offset"], i["data"]) for f in frames if f["type"] == "chunks" for i in f["items"]]


async def test_sends_available_chunks_in_one_frame_then_live_then_end() -> None:
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite_many(s.id, ["a", "b", "c"])
    ws = await connect(s.id)
    first = await ws.receive_json_from(5)
    assert first == {
        "type": "chunks",
        "frame": first["frame"],
        "stream": str(s.id),
        "items": [{"offset": 0, "data": "a"}, {"offset": 1, "data": "b"}, {"offset": 2, "data": "c"}],
    }
    await pgstreams.awrite(s.id, "d")
    second = await ws.receive_json_from(5)
    assert second["items"] == [{"offset": 3, "data": "d"}] and second["frame"] != first["frame"]
    await ws.send_json_to({"type": "ack", "frame": second["frame"]})
    await pgstreams.aclose(s.id)
    frames, code = await receive_all(ws)
    assert frames == [{"type": "end", "next_offset": 4}] and code == 1000


async def test_resume_from_an_offset_and_from_the_end() -> None:
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite_many(s.id, [f"t{i}" for i in range(6)])
    await pgstreams.aclose(s.id)
    frames, code = await receive_all(await connect(s.id, "from=4"))
    assert offsets(frames) == [(4, "t4"), (5, "t5")] and frames[-1] == {"type": "end", "next_offset": 6}
    frames, code = await receive_all(await connect(s.id, "from=6"))
    assert frames == [{"type": "end", "next_offset": 6}] and code == 1000


@pytest.mark.parametrize(
    "query", ["from=-1", "from=abc", "from=1.5", "from=1&from=2", "from=", "from=99999999999999999999", "from=7"]
)
async def test_bad_offsets_close_with_4400(query: str) -> None:
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite_many(s.id, ["a", "b"])
    frames, code = await receive_all(await connect(s.id, query))
    assert code == 4400
    assert frames[0]["type"] == "error" and frames[0]["code"] == 4400 and frames[0]["message"]


@pytest.mark.parametrize("bad", ["not-a-uuid", "1234", "%00", "0" * 40])
async def test_malformed_stream_ids_close_with_4400(bad: str) -> None:
    frames, code = await receive_all(await connect(bad))
    assert code == 4400 and "not a stream id" in frames[0]["message"]


async def test_unknown_stream_closes_with_4404() -> None:
    frames, code = await receive_all(await connect(uuid.uuid4()))
    assert code == 4404 and "no stream" in frames[0]["message"]


@sync_to_async
def make_user(name: str, **extra: Any):
    return get_user_model().objects.create_user(name, password="pw", **extra)


@sync_to_async
def grant(user: Any, codename: str) -> Any:
    from django.contrib.auth.models import Permission

    user.user_permissions.add(Permission.objects.get(content_type__app_label="pgstreams", codename=codename))
    return get_user_model().objects.get(pk=user.pk)  # a fresh instance: permissions are cached


async def test_authorization_owner_permission_holders_others_and_anonymous() -> None:
    alice, bob = await make_user("alice"), await make_user("bob")
    staff = await make_user("staff", is_staff=True)  # staff, but without the permission
    viewer = await grant(await make_user("viewer", is_staff=True), "view_stream")
    root = await sync_to_async(get_user_model().objects.create_superuser)("root", password="pw")
    owned = await pgstreams.acreate_stream(owner=alice)
    await pgstreams.awrite(owned.id, "secret")
    await pgstreams.aclose(owned.id)
    cases = [(bob, 4403), (None, 4403), (staff, 4403), (alice, 1000), (viewer, 1000), (root, 1000)]
    for user, expected in cases:
        frames, code = await receive_all(await connect(owned.id, user=user))
        assert code == expected, user
        if expected == 4403:
            assert all(f["type"] == "error" for f in frames)  # not a byte of data
        else:
            assert offsets(frames) == [(0, "secret")]
    # A stream without an owner is a capability link: anyone with its id may read it.
    public = await pgstreams.acreate_stream()
    await pgstreams.aclose(public.id)
    assert (await receive_all(await connect(public.id)))[1] == 1000


async def test_authorize_setting_is_used(settings) -> None:
    settings.PGSTREAMS = {"AUTHORIZE": "tests.test_websocket.nobody_may_read"}
    s = await pgstreams.acreate_stream()
    assert (await receive_all(await connect(s.id)))[1] == 4403


def nobody_may_read(user: Any, stream: Any) -> bool:
    return False


async def test_a_client_that_does_not_ack_gets_one_window_then_resumes_after_an_ack() -> None:
    s = await pgstreams.acreate_stream()
    total = consumers.WINDOW_CHUNKS + 300
    for start in range(0, total, 500):
        await pgstreams.awrite_many(s.id, [str(i) for i in range(start, min(total, start + 500))])
    await pgstreams.aclose(s.id)
    ws = await connect(s.id)
    frames = []
    while len(offsets(frames)) < consumers.WINDOW_CHUNKS:
        frames.append(await ws.receive_json_from(5))
    assert len(offsets(frames)) == consumers.WINDOW_CHUNKS
    assert await ws.receive_nothing(0.5)  # and no more without an ack
    await ws.send_json_to({"type": "ack", "frame": frames[-1]["frame"]})
    rest, code = await receive_all(ws)
    assert [o for o, _ in offsets(frames + rest)] == list(range(total))
    assert rest[-1] == {"type": "end", "next_offset": total} and code == 1000


async def test_after_the_end_frame_the_server_closes_once_the_client_has_acknowledged_everything() -> None:
    # Closing at once would let daphne abort a slow client's connection, losing frames it had
    # not read yet (the end frame among them).
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite_many(s.id, ["a", "b"])
    await pgstreams.aclose(s.id)
    ws = await connect(s.id)
    chunks = await ws.receive_json_from(5)
    assert offsets([chunks]) == [(0, "a"), (1, "b")]
    assert await ws.receive_json_from(5) == {"type": "end", "next_offset": 2}
    assert await ws.receive_nothing(0.5)  # not closed while chunks are unacknowledged
    await ws.send_json_to({"type": "ack", "frame": chunks["frame"]})
    assert (await ws.receive_output(5)) == {"type": "websocket.close", "code": 1000}


@pytest.mark.parametrize(
    ("send", "fragment"),
    [
        ({"bytes_data": b"\x00\x01"}, "binary"),
        ({"text_data": "not json"}, "JSON"),
        ({"text_data": '{"type": "subscribe", "stream": "*"}'}, "only client message"),
        ({"text_data": '{"type": "ack", "offset": 3}'}, "only client message"),
        ({"text_data": '{"type": "ack", "frame": 7}'}, "only client message"),
        ({"text_data": '{"type": "ack", "frame": "guessed"}'}, "not sent on this socket"),
        ({"text_data": "[" * 5000}, "at most"),
    ],
)
async def test_junk_client_frames_close_with_4400_and_a_reason(send: dict, fragment: str) -> None:
    s = await pgstreams.acreate_stream()
    ws = await connect(s.id)
    await ws.send_to(**send)
    frames, code = await receive_all(ws)
    assert code == 4400 and fragment in frames[-1]["message"]
    await pgstreams.awrite(s.id, "still fine")  # the stream is untouched


async def test_demo_application_refuses_a_foreign_origin() -> None:
    from demo_project.asgi import application

    s = await pgstreams.acreate_stream()
    communicator = WebsocketCommunicator(
        application, f"/ws/pgstreams/{s.id}/", headers=[(b"origin", b"http://evil.example"), (b"host", b"127.0.0.1")]
    )
    connected, _ = await communicator.connect()
    assert not connected
    good = WebsocketCommunicator(
        application, f"/ws/pgstreams/{s.id}/", headers=[(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
    )
    connected, _ = await good.connect()
    assert connected
    await good.disconnect()


async def test_a_client_silent_with_a_full_window_is_closed_with_4408(monkeypatch) -> None:
    monkeypatch.setattr(consumers, "ACK_TIMEOUT", 0.3)
    monkeypatch.setattr(consumers, "WINDOW_CHUNKS", 10)
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite_many(s.id, [str(i) for i in range(25)])
    frames, code = await receive_all(await connect(s.id), ack=False)
    assert len(offsets(frames)) == 10
    assert code == 4408 and "?from=0" in frames[-1]["message"]


async def test_rights_revoked_mid_stream_hold_until_the_reader_reconnects(settings) -> None:
    """Authorization is checked when a reader connects: revoking it does not cut an open socket,
    and the next connection is refused."""
    alice = await make_user("alice")
    s = await pgstreams.acreate_stream(owner=alice)
    await pgstreams.awrite(s.id, "before")
    ws = await connect(s.id, user=alice)
    assert offsets([await ws.receive_json_from(5)]) == [(0, "before")]
    settings.PGSTREAMS = {"AUTHORIZE": "tests.test_websocket.nobody_may_read"}
    await pgstreams.awrite(s.id, "after")
    assert offsets([await ws.receive_json_from(5)]) == [(1, "after")]
    await ws.disconnect()
    frames, code = await receive_all(await connect(s.id, "from=2", user=alice))
    assert code == 4403


async def test_pruned_chunks_close_with_4410_and_say_where_to_resume() -> None:
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite_many(s.id, [f"t{i}" for i in range(10)])
    await pgstreams.aclose(s.id)
    await sync_to_async(delete_chunks)(s.id, 0, 5)
    frames, code = await receive_all(await connect(s.id, "from=2"))
    assert code == 4410 and not offsets(frames)
    assert frames[-1]["type"] == "error" and frames[-1]["first_offset"] == 5 and "pruned" in frames[-1]["message"]
    frames, code = await receive_all(await connect(s.id, "from=5"))
    assert offsets(frames) == [(i, f"t{i}") for i in range(5, 10)] and code == 1000


async def test_deleting_a_user_deletes_their_streams_so_no_one_else_can_read_them() -> None:
    alice = await make_user("alice")
    s = await pgstreams.acreate_stream(owner=alice)
    await pgstreams.awrite(s.id, "private")
    await sync_to_async(alice.delete)()
    frames, code = await receive_all(await connect(s.id))
    assert code == 4404 and not offsets(frames)
    assert not await Chunk.objects.filter(stream_id=s.id).aexists()


async def test_the_window_counts_the_bytes_of_frames_exactly(monkeypatch) -> None:
    # A control character takes 6 bytes in JSON (\u0001): the window is what the frames weigh.
    monkeypatch.setattr(consumers, "WINDOW_BYTES", 20_000)
    s = await pgstreams.acreate_stream()
    chunk = "\x01" * 1000
    await pgstreams.awrite_many(s.id, [chunk] * 40)
    ws = await connect(s.id)
    frames = []
    while (message := await ws.receive_output(1)) and message["type"] == "websocket.send":
        frames.append(message["text"])
        if await ws.receive_nothing(0.3):
            break
    sent = sum(len(text.encode()) for text in frames)
    one_item = len(json.dumps({"offset": 39, "data": chunk}, separators=(",", ":")).encode())
    # Frames are sent while the window has room; the last one may take one item past it.
    assert 20_000 - one_item < sent <= 20_000 + one_item
    assert [i["data"] for f in frames for i in json.loads(f)["items"]] == [chunk] * len(
        offsets(map(json.loads, frames))
    )
    await ws.disconnect()


async def test_a_client_with_a_full_window_pins_no_chunk_it_was_not_sent(monkeypatch) -> None:
    # A reader behind the listener's window gets whole pages (up to 500 chunks); a consumer
    # waiting for acks must not sit on the part of the page it could not send.
    import gc

    from prometheus_client import REGISTRY

    from pgstreams.types import StreamChunk

    def readers() -> float:
        return REGISTRY.get_sample_value("pgstreams_active_readers")

    monkeypatch.setattr(consumers, "WINDOW_CHUNKS", 10)
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite_many(s.id, [f"c{i}" for i in range(400)])
    before = readers()
    ws = await connect(s.id)
    frames = []
    while len(offsets(frames)) < 10:
        frames.append(await ws.receive_json_from(5))
    assert await ws.receive_nothing(0.3)  # the window is full
    for _ in range(50):  # bounded: until the consumer has let go of its reader (never, before)
        if readers() == before:
            break
        await asyncio.sleep(0.1)
    gc.collect()
    held = [o for o in gc.get_objects() if isinstance(o, StreamChunk) and o.stream_id == s.id]
    assert held == []
    await ws.send_json_to({"type": "ack", "frame": frames[-1]["frame"]})
    more = await ws.receive_json_from(5)
    assert offsets([more]) == [(i, f"c{i}") for i in range(10, 20)]
    await ws.disconnect()


async def test_after_a_refusal_no_chunk_frame_is_sent() -> None:
    """The error frame and the close were sent, and the socket's pump went on: a chunk written
    after them went out too (until the client's disconnect reached the consumer)."""
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite(s.id, "a")
    ws = await connect(s.id)
    assert offsets([await ws.receive_json_from(5)]) == [(0, "a")]  # at the tail now, with the stream's fan
    await ws.send_json_to({"type": "ack", "frame": "guessed"})
    error = await ws.receive_json_from(5)
    assert error["code"] == 4400 and "not sent on this socket" in error["message"]
    assert await ws.receive_output(5) == {"type": "websocket.close", "code": 4400}
    await pgstreams.awrite(s.id, "b")
    async for chunk in pgstreams.aread(s.id, from_offset=1, timeout=5):
        assert chunk.data == "b"  # delivered in this process: the socket's fan had it too
        break
    assert await ws.receive_nothing(0.5)
    await ws.disconnect()


# -- hostile client frames against a real server ---------------------------------------------------

# The demo's ASGI application under a server (daphne or uvicorn, by its command line's arguments),
# with one more route: GET /test/consumers/ answers what the server process holds of WebSocket
# clients: the pumps still pending, and the clients and readers its metrics count.
CONSUMERS_SERVER = """
import asyncio, json, os, sys
server, arguments = sys.argv[1], sys.argv[2:]
if server == "daphne":
    import daphne.server  # twisted's asyncio reactor, installed before anything else imports one
from prometheus_client import REGISTRY
from demo_project.asgi import application as demo
from pgstreams import consumers
for name, kind in (("ACK_TIMEOUT", float), ("SEND_TIMEOUT", float), ("WINDOW_BYTES", int), ("WINDOW_CHUNKS", int)):
    if "TEST_" + name in os.environ:  # set by the test's environment
        setattr(consumers, name, kind(os.environ["TEST_" + name]))

async def application(scope, receive, send):
    if scope["type"] == "http" and scope["path"] == "/test/consumers/":
        tasks = [t for t in asyncio.all_tasks() if t.get_name().startswith("pgstreams-ws-") and not t.done()]
        held = {
            "pumps": len(tasks),
            "clients": REGISTRY.get_sample_value("pgstreams_websocket_clients"),
            "readers": REGISTRY.get_sample_value("pgstreams_active_readers"),
        }
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": json.dumps(held).encode()})
        return
    await demo(scope, receive, send)

if server == "daphne":
    from daphne.cli import CommandLineInterface
    CommandLineInterface().run(arguments)
else:
    from uvicorn.main import main
    main(arguments)
"""


@contextlib.contextmanager
def consumers_serving(server: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """``CONSUMERS_SERVER`` under ``server`` on a free loopback port, against the test database."""
    port = free_port()
    command = server_command(server, "__main__:application", port)
    with serving([sys.executable, "-c", CONSUMERS_SERVER, server, *command[3:]], port, env=env) as host:
        yield host


@pytest.fixture(scope="module")
def consumers_server(django_db_setup: None) -> Iterator[str]:
    with consumers_serving("daphne") as host:
        yield host


async def held_by(host: str) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=10) as client:
        return (await client.get(f"http://{host}/test/consumers/")).json()


async def released(host: str) -> dict[str, float]:
    """What the server holds of WebSocket clients, once it holds none (or after 10 s: then what
    it still holds)."""
    for _ in range(100):  # bounded: 10 s
        held = await held_by(host)
        if held == {"pumps": 0, "clients": 0, "readers": 0}:
            break
        await asyncio.sleep(0.1)
    return held


async def close_after(host: str, path: str, frame: str | bytes, *, text: bool | None = None) -> tuple[list, int]:
    """Open a socket, send ``frame`` (bytes as a text frame with ``text``), and read what comes
    back until the server closes it: (the messages, the close code)."""
    messages = []
    async with websockets.connect(f"ws://{host}{path}", origin=f"http://{host}", open_timeout=20, max_size=None) as ws:
        await ws.send(frame, text=text)
        try:
            async with asyncio.timeout(20):
                async for raw in ws:
                    messages.append(json.loads(raw))
        except websockets.ConnectionClosed:
            pass
    return messages, ws.close_code


HOSTILE_FRAMES: list[tuple[str | bytes, str]] = [
    ("[" * 1000, "JSON"),  # RecursionError in Python 3.11's json
    ("[" * 1024, "JSON"),
    ('{"a":' * 200, "JSON"),
    ("[" * 5000, "at most"),
    ("é" * 1000, "at most"),  # 1,000 characters, 2,000 bytes
    ("1" * 1000, "only client message"),
    ("1e999", "only client message"),
    ("-0", "only client message"),
    ('{"type": "ack", "frame": ' + "9" * 900 + "}", "only client message"),
    ('{"type": ["ack"], "frame": "x"}', "only client message"),
    ('{"type": "ack", "frame": ["x"]}', "only client message"),
    ('{"type": "ack", "frame": {"x": 1}}', "only client message"),
    ('{"type": "ack", "frame": null}', "only client message"),
    ('{"type": "ack"}', "only client message"),
    ("[]", "only client message"),
    ("null", "only client message"),
    ('"ack"', "only client message"),
    ("", "JSON"),
    ("\x00", "JSON"),
    ("NaN", "only client message"),
    ('{"type": "ack", "frame": "\\u0000"}', "not sent on this socket"),
    ('{"type": "ack", "frame": "\\ud800"}', "not sent on this socket"),
    ('{"type": "ack", "frame": "x", "type": "ack"}', "not sent on this socket"),
    (b"", "binary"),
    (b"\x00\x01", "binary"),
    (b"[" * 1000, "binary"),
]


@pytest.mark.multiprocess
async def test_hostile_client_frames_get_4400_and_an_error_frame_and_leave_nothing_behind(
    consumers_server: str,
) -> None:
    """Each frame on a socket of its own, on an idle open stream: an error frame saying what is
    wrong, the close code 4400, and once the sockets are closed no pump, counted client or reader
    left in the server. A frame of 1,000 '[' crashed the consumer (1011, no error frame) and left
    its pump and its count behind for good."""
    s = await pgstreams.acreate_stream()
    path = f"/ws/pgstreams/{s.id}/"
    assert await released(consumers_server) == {"pumps": 0, "clients": 0, "readers": 0}
    # One socket at a time: daphne drops (TCP reset) a socket it is closing whose client has not
    # answered the close when autobahn's close-handshake timer fires (1 s, rounded down to a
    # whole second of the clock: from a few ms to 1 s). 26 sockets at once, the test process and
    # daphne starved of CPU, a client sometimes got 1006 and neither the error frame nor the close
    # (in CI; reproduced with daphne under `nice` beside busy loops, its log saying "closing
    # handshake timeout" for each such socket).
    got = [await close_after(consumers_server, path, frame) for frame, _ in HOSTILE_FRAMES]
    wrong = []
    for (frame, fragment), (messages, code) in zip(HOSTILE_FRAMES, got, strict=True):
        error = messages[-1] if messages else {}
        if not (code == 4400 and error.get("code") == 4400 and fragment in error.get("message", "")):
            wrong.append((frame[:20], code, messages[-1:]))
    assert wrong == [], wrong
    assert await released(consumers_server) == {"pumps": 0, "clients": 0, "readers": 0}


@pytest.mark.multiprocess
async def test_twenty_sockets_of_deep_json_leave_no_pump_or_client_behind(consumers_server: str) -> None:
    s = await pgstreams.acreate_stream()
    path = f"/ws/pgstreams/{s.id}/"
    got = await asyncio.gather(*(close_after(consumers_server, path, "[" * 1000) for _ in range(20)))
    # Each closed by the server: 4400, or 1006 when daphne dropped it at its close-handshake timer
    # (see the test above, which checks the error frame and 4400 one socket at a time).
    codes = {code for _, code in got}
    assert codes <= {4400, 1006} and 4400 in codes  # never 1011, the crash this guards against
    assert await released(consumers_server) == {"pumps": 0, "clients": 0, "readers": 0}
    await pgstreams.awrite(s.id, "still served")
    await pgstreams.aclose(s.id)
    messages, code = await close_after(consumers_server, path, '{"type": "ack", "frame": "none"}')
    assert code == 4400  # a socket after them is served as before


@pytest.mark.multiprocess
async def test_a_text_frame_of_invalid_utf8_is_closed_by_the_transport_and_leaves_nothing_behind(
    consumers_server: str,
) -> None:
    s = await pgstreams.acreate_stream()
    messages, code = await close_after(consumers_server, f"/ws/pgstreams/{s.id}/", b"\xff\xfe[", text=True)
    # The server's WebSocket layer refuses it (daphne's drops the connection: 1006); the consumer
    # never sees it, and ends all the same.
    assert code in (1006, 1007) and messages == []
    assert await released(consumers_server) == {"pumps": 0, "clients": 0, "readers": 0}


@pytest.mark.multiprocess
async def test_a_client_that_reads_nothing_is_refused_and_given_up_not_held_for_ever() -> None:
    """uvicorn's sends wait while its client reads nothing (over the loopback the kernel holds a
    whole default window, so the window here is widened past what it holds). Such a send failed
    ("await wasn't used with future") and the socket was taken for broken: nothing more was sent
    and the client stayed counted. And the refusal of such a client, its window full, waited for
    the frames before it with no limit: the consumer and its pump stayed for as long as the
    client kept its socket open."""
    s = await pgstreams.acreate_stream()
    for start in range(0, 400, 50):
        await pgstreams.awrite_many(s.id, [f"{i:05}" + "x" * 60_000 for i in range(start, start + 50)])  # 24 MB
    env = {
        "TEST_ACK_TIMEOUT": "1",
        "TEST_SEND_TIMEOUT": "1",
        "TEST_WINDOW_BYTES": str(16 << 20),
        "TEST_WINDOW_CHUNKS": "100000",
    }
    with consumers_serving("uvicorn", env=env) as host:
        client = await asyncio.to_thread(RawWebSocket, host, f"/ws/pgstreams/{s.id}/")  # reads nothing
        try:
            for _ in range(100):  # bounded: 10 s for the consumer to count its client
                if (await held_by(host))["clients"] == 1:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the server never counted the client")
            assert await released(host) == {"pumps": 0, "clients": 0, "readers": 0}
        finally:
            client.close()


def authorize_on_a_lost_connection(user: Any, stream: Any) -> bool:
    """An AUTHORIZE rule whose query finds its connection gone (its backend terminated), as any
    lookup does while the server restarts or PgBouncer refuses logins."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    return True


def authorize_with_a_defect(user: Any, stream: Any) -> bool:
    raise RuntimeError("a defect in the project's rule")


@pytest.mark.parametrize("rule", ["authorize_on_a_lost_connection", "authorize_with_a_defect"])
async def test_a_socket_whose_lookup_fails_is_closed_by_the_consumer_with_a_reason(rule: str) -> None:
    """The authorization lookup fails after the accept (the database lost, or the project's rule
    raising): the consumer sends an error frame and closes with 4500 itself, rather than raising
    and leaving the close to the server: daphne's was 1011 and stopped coming once a streaming
    response of the process had failed (the soak's silent sockets), uvicorn sent no close frame,
    granian 1005, and none said why."""
    s = await pgstreams.acreate_stream()
    with override_settings(PGSTREAMS={"AUTHORIZE": f"{__name__}.{rule}"}):
        ws = await connect(s.id, "from=0")
        frames, code = await receive_all(ws)
    assert code == 4500
    assert [(f["type"], f["code"]) for f in frames] == [("error", 4500)]
    assert frames[0]["message"] == "could not look the stream up; reconnect with ?from=0"


async def test_an_exception_inside_the_consumer_cancels_its_pump_and_counts_its_client_out(monkeypatch) -> None:
    from prometheus_client import REGISTRY

    def clients() -> float:
        return REGISTRY.get_sample_value("pgstreams_websocket_clients")

    def pumps() -> list[asyncio.Task]:
        return [t for t in asyncio.all_tasks() if t.get_name().startswith("pgstreams-ws-") and not t.done()]

    def broken(self: consumers.StreamConsumer, frame: str) -> bool:
        raise RuntimeError("a defect in the consumer")

    monkeypatch.setattr(consumers.StreamConsumer, "ack", broken)
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite(s.id, "a")
    before = clients()
    ws = await connect(s.id)
    frame = await ws.receive_json_from(5)  # its pump runs
    assert clients() == before + 1 and len(pumps()) == 1
    await ws.send_json_to({"type": "ack", "frame": frame["frame"]})
    with pytest.raises(RuntimeError, match="a defect"):
        await ws.receive_output(5)  # the application's exception, as the server gets it
    for _ in range(10):  # a cancelled task ends at the loop's next turns
        await asyncio.sleep(0)
    assert clients() == before and pumps() == []
