"""The Server-Sent Events view: events, resume by Last-Event-ID or ?from=, end, errors, access."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.test import AsyncClient

import pgstreams
from pgstreams import fetch, views
from pgstreams.models import Stream
from tests.helpers import delete_chunks

pytestmark = pytest.mark.django_db(transaction=True)


def url(stream_id) -> str:
    return f"/pgstreams/streams/{stream_id}/events"


async def events(response) -> list[dict]:
    """Parse the whole event stream into dicts of its fields."""
    body = b"".join([part async for part in response.streaming_content]).decode()
    parsed = []
    for block in body.split("\n\n"):
        fields: dict = {}
        for line in block.splitlines():
            name, _, value = line.partition(": ")
            fields[name] = value
        if fields:
            parsed.append(fields)
    return parsed


def chunks(parsed: list[dict]) -> list[tuple[int, str]]:
    out = []
    for e in parsed:
        if "data" in e and "event" not in e:
            item = json.loads(e["data"])
            assert int(e["id"]) == item["offset"]
            out.append((item["offset"], item["data"]))
    return out


async def test_events_then_end() -> None:
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite_many(s.id, ["a", "line one\nline two\r\n", "c"])
    await pgstreams.aclose(s.id)
    response = await AsyncClient().get(url(s.id))
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    assert response["Cache-Control"] == "no-cache"
    parsed = await events(response)
    assert parsed[0] == {"retry": "1000"}
    assert chunks(parsed) == [(0, "a"), (1, "line one\nline two\r\n"), (2, "c")]
    assert parsed[-1] == {"event": "end", "data": '{"next_offset": 3}'}


async def test_format_html_sends_each_chunk_escaped_with_its_line_breaks_as_data_lines() -> None:
    """What htmx's SSE extension swaps in: EventSource joins an event's data lines with a line
    break, so each chunk arrives as its own text, escaped."""
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite_many(s.id, ["<b>&'\"", "line one\nline two\r\n", ""])
    await pgstreams.aclose(s.id)
    response = await AsyncClient().get(url(s.id) + "?format=html&from=0")
    assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
    body = b"".join([part async for part in response.streaming_content]).decode()
    assert body == (
        "retry: 1000\n\n"
        "id: 0\ndata: &lt;b&gt;&amp;&#x27;&quot;\n\n"
        "id: 1\ndata: line one\ndata: line two&#13;\ndata: \n\n"
        "id: 2\ndata: \n\n"
        'event: end\ndata: {"next_offset": 3}\n\n'
    )


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("?format=xml", "format is 'json' (the default) or 'html', not 'xml'"),
        ("?format=html&format=json", "give 'format' once, not 2 times"),
    ],
)
async def test_an_unknown_format_is_400_with_the_choices(query: str, reason: str) -> None:
    s = await pgstreams.acreate_stream()
    response = await AsyncClient().get(url(s.id) + query)
    assert response.status_code == 400 and response.content.decode().strip() == reason


async def test_format_html_of_a_stream_of_bytes_is_400() -> None:
    s = await Stream.objects.acreate(content_type="application/octet-stream")
    response = await AsyncClient().get(url(s.id) + "?format=html")
    assert response.status_code == 400
    assert response.content.decode().strip() == (
        f"format=html is for text streams; stream {s.id} holds bytes (application/octet-stream)"
    )


async def test_resume_with_last_event_id_or_from() -> None:
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite_many(s.id, [f"t{i}" for i in range(5)])
    await pgstreams.aclose(s.id)
    client = AsyncClient()
    assert chunks(await events(await client.get(url(s.id), headers={"last-event-id": "2"}))) == [(3, "t3"), (4, "t4")]
    assert chunks(await events(await client.get(url(s.id) + "?from=4"))) == [(4, "t4")]
    # Last-Event-ID (a reconnect) wins over the ?from= of the original URL.
    assert chunks(await events(await client.get(url(s.id) + "?from=0", headers={"last-event-id": "3"}))) == [(4, "t4")]


async def test_a_long_stream_is_served_over_several_responses(monkeypatch) -> None:
    """A response ends after the batch that reaches RESPONSE_BYTES; a batch is at most a page."""
    monkeypatch.setattr(views, "RESPONSE_BYTES", 2000)
    monkeypatch.setattr(fetch, "PAGE_BYTES", 500)
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite_many(s.id, ["x" * 100] * 60)
    await pgstreams.aclose(s.id)
    client, got, last, rounds = AsyncClient(), [], None, 0
    while rounds < 20:
        rounds += 1
        headers = {"last-event-id": str(last)} if last is not None else {}
        parsed = await events(await client.get(url(s.id), headers=headers))
        got += chunks(parsed)
        last = got[-1][0] if got else None
        if parsed[-1].get("event") == "end":
            break
    assert [o for o, _ in got] == list(range(60)) and rounds > 2


@pytest.mark.parametrize(
    ("query", "headers"),
    [
        ("?from=-1", {}),
        ("?from=x", {}),
        ("?from=1&from=2", {}),
        ("?from=9", {}),
        ("", {"last-event-id": "abc"}),
        ("", {"last-event-id": "-5"}),
    ],
)
async def test_bad_offsets_are_400_with_a_reason(query: str, headers: dict) -> None:
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite(s.id, "a")
    response = await AsyncClient().get(url(s.id) + query, headers=headers)
    assert response.status_code == 400 and response.content.strip()


async def test_bad_and_unknown_ids() -> None:
    client = AsyncClient()
    assert (await client.get(url(uuid.uuid4()))).status_code == 404
    assert (await client.get("/pgstreams/streams/not-a-uuid/events")).status_code == 404


async def test_authorization_matches_the_websocket() -> None:
    users = get_user_model().objects
    alice = await sync_to_async(users.create_user)("alice", password="pw")
    await sync_to_async(users.create_user)("bob", password="pw")
    s = await pgstreams.acreate_stream(owner=alice)
    await pgstreams.awrite(s.id, "secret")
    await pgstreams.aclose(s.id)
    anonymous = AsyncClient()
    response = await anonymous.get(url(s.id))
    assert response.status_code == 403 and b"secret" not in response.content
    bob = AsyncClient()
    await bob.alogin(username="bob", password="pw")
    assert (await bob.get(url(s.id))).status_code == 403
    staff = AsyncClient()
    await sync_to_async(users.create_user)("staff", password="pw", is_staff=True)
    await staff.alogin(username="staff", password="pw")
    assert (await staff.get(url(s.id))).status_code == 403  # staff without pgstreams.view_stream
    owner = AsyncClient()
    await owner.alogin(username="alice", password="pw")
    assert chunks(await events(await owner.get(url(s.id)))) == [(0, "secret")]
    await sync_to_async(alice.delete)()  # the user's streams go with the user
    assert (await anonymous.get(url(s.id))).status_code == 404


async def test_pruned_chunks_end_the_response_with_an_error_event_saying_where_to_resume() -> None:
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite_many(s.id, [f"t{i}" for i in range(10)])
    await pgstreams.aclose(s.id)
    await sync_to_async(delete_chunks)(s.id, 0, 5)
    parsed = await events(await AsyncClient().get(url(s.id) + "?from=2"))
    assert chunks(parsed) == []
    assert parsed[-1]["event"] == "error"
    error = json.loads(parsed[-1]["data"])
    assert error["first_offset"] == 5 and "pruned" in error["message"]


def _shortcut() -> object:
    """The SSE view's project as DurableStreamsFirst serves it, made now."""
    from django.core.asgi import get_asgi_application

    from pgstreams.durable.asgi import DurableStreamsFirst

    return DurableStreamsFirst(get_asgi_application())


async def test_open_sse_responses_through_the_shortcut_hold_no_thread_each() -> None:
    """Through Django's handler, each response keeps a thread of its own (the request's thread
    for its middleware's hops) until it ends; through the shortcut, none."""
    s = await pgstreams.acreate_stream()
    app, opened = _shortcut(), [asyncio.Event() for _ in range(21)]

    async def subscriber(k: int) -> None:
        requested = False

        async def receive() -> dict:
            nonlocal requested
            if not requested:
                requested = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await asyncio.Event().wait()  # the client never leaves: cancelled at the end
            raise AssertionError

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                assert message["status"] == 200
            elif message.get("body"):
                opened[k].set()

        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
            "path": url(s.id), "raw_path": url(s.id).encode(), "root_path": "", "query_string": b"",
            "headers": [(b"host", b"127.0.0.1")], "client": ("127.0.0.1", 40000 + k), "server": ("127.0.0.1", 80),
        }  # fmt: skip
        await app(scope, receive, send)

    tasks = [asyncio.create_task(subscriber(0))]  # the first starts the listener and the lookups' pool
    try:
        await asyncio.wait_for(opened[0].wait(), 30)
        before = {thread.name for thread in threading.enumerate()}
        tasks += [asyncio.create_task(subscriber(k)) for k in range(1, 21)]
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in opened)), 30)
        more = sorted({thread.name for thread in threading.enumerate()} - before)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    print(f"20 more open SSE responses through the shortcut: threads {more}")
    assert len(more) <= 1  # the lookups' pool's second thread, at most


async def test_the_shortcut_serves_the_sse_view_to_its_owner_signed_in_and_refuses_others() -> None:
    owner = await sync_to_async(get_user_model().objects.create_user)("shortcut-sse-owner")
    s = await pgstreams.acreate_stream(owner=owner)
    await pgstreams.awrite(s.id, "mine")
    await pgstreams.aclose(s.id)
    signed_in = AsyncClient()
    await signed_in.aforce_login(owner)
    transport = httpx.ASGITransport(app=_shortcut())
    session = {"sessionid": signed_in.cookies["sessionid"].value}
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as stranger,
        httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", cookies=session) as client,
    ):
        anonymous = await stranger.get(url(s.id))
        theirs = await client.get(url(s.id))
        posted = await client.post(url(s.id))  # not the shortcut's: Django's CSRF check
    assert anonymous.status_code == 403
    assert theirs.status_code == 200 and '"data":"mine"' in theirs.text and "event: end" in theirs.text
    assert posted.status_code == 403 and "CSRF" in posted.text
