"""The demo served by daphne in its own process: WebSocket clients over real sockets, and a real
browser (Debian's Chromium driven by Playwright) reading an answer across a reload and tailing a
stream on its admin page."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading

import pytest
import websockets

import pgstreams
from demo_project.chat import llm
from tests.helpers import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


async def follow(host: str, stream_id, from_offset: int = 0) -> tuple[list[tuple[int, str]], int]:
    """A WebSocket client that acks what it gets; returns (chunks, end's next_offset)."""
    got = []
    async with websockets.connect(
        f"ws://{host}/ws/pgstreams/{stream_id}/?from={from_offset}", origin=f"http://{host}", open_timeout=10
    ) as ws:
        async for raw in ws:
            message = json.loads(raw)
            if message["type"] == "chunks":
                got += [(i["offset"], i["data"]) for i in message["items"]]
                try:
                    await ws.send(json.dumps({"type": "ack", "frame": message["frame"]}))
                except websockets.ConnectionClosedOK:
                    pass  # the server sent the end and closed while this ack was on its way
            elif message["type"] == "end":
                return got, message["next_offset"]
    raise AssertionError(f"closed without an end frame: code {ws.close_code}")


async def test_websocket_clients_of_a_daphne_process_get_every_chunk(demo_server: str) -> None:
    s = await pgstreams.acreate_stream()
    clients = [asyncio.create_task(follow(demo_server, s.id)) for _ in range(8)]
    clients.append(asyncio.create_task(follow(demo_server, s.id, from_offset=0)))
    await asyncio.sleep(0.5)
    expected = []
    for i in range(400):
        expected.append((i, f"tok{i} "))
        await pgstreams.awrite(s.id, f"tok{i} ")
        if i % 50 == 0:
            await asyncio.sleep(0.01)
    await pgstreams.aclose(s.id)
    results = await asyncio.wait_for(asyncio.gather(*clients), 60)
    for got, next_offset in results:
        assert got == expected and next_offset == 400
    # A late client resumes from the middle.
    got, _ = await asyncio.wait_for(follow(demo_server, s.id, from_offset=390), 20)
    assert got == expected[390:]


@pytest.fixture
def page():
    """A page of Debian's Chromium, headless, driven by Playwright (no browser is downloaded)."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"Chromium is not installed at {CHROMIUM} (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            page = browser.new_page(viewport={"width": 390, "height": 844})
            page.set_default_timeout(20_000)
            yield page
        finally:
            browser.close()


def in_thread(function, *args):
    """Run a database call in another thread: Playwright's sync API runs an event loop in this one."""
    done = []
    worker = threading.Thread(target=lambda: done.append(function(*args)))
    worker.start()
    worker.join(30)
    return done[0] if done else None


def test_the_chat_page_streams_an_answer_that_survives_a_reload(demo_server: str, page) -> None:
    prompt = "Why does a NOTIFY per write not scale?"
    expected = "".join(llm.answer(prompt))
    page.goto(f"http://{demo_server}/")
    assert "sign in as" in page.inner_text("main")
    page.fill("#id_username", "demo")
    page.fill("#id_password", "demo")
    page.click("form.login button")
    page.fill("#prompt", prompt)
    page.click("form.ask button")
    page.wait_for_selector("#status[data-state=live]")
    # Tokens arrive one after another: the answer grows while the status is live.
    page.wait_for_function("document.getElementById('answer').textContent.length > 20")
    first = page.inner_text("#answer")
    page.wait_for_function(f"document.getElementById('answer').textContent.length > {len(first) + 20}")
    assert page.get_attribute("#status", "data-state") == "live"
    page.reload()  # mid-answer
    page.wait_for_selector("#status[data-state=done]")
    shown = page.eval_on_selector("#answer", "el => el.textContent")
    assert shown == expected  # the whole answer, exactly once
    assert page.inner_text("#status") == f"done · {len(llm.answer(prompt))} tokens"


def test_the_admin_stream_page_tails_an_open_stream(demo_server: str, page) -> None:
    from django.contrib.auth import get_user_model

    in_thread(lambda: get_user_model().objects.create_superuser("boss", password="boss-password"))
    stream = in_thread(lambda: pgstreams.create_stream(label="tail me"))
    in_thread(pgstreams.write_many, stream.id, ["before "])
    page.goto(f"http://{demo_server}/admin/login/")
    page.fill("#id_username", "boss")
    page.fill("#id_password", "boss-password")
    page.click("input[type=submit]")
    page.goto(f"http://{demo_server}/admin/pgstreams/stream/{stream.id}/change/")
    assert page.inner_text("#pgstreams-text") == "before "
    page.wait_for_function("document.getElementById('pgstreams-tail-status').textContent.includes('live')")
    for word in ("live ", "tail"):
        in_thread(pgstreams.write, stream.id, word)
    page.wait_for_function("document.getElementById('pgstreams-tail').textContent === 'live tail'")
    in_thread(pgstreams.close, stream.id)
    page.wait_for_function("document.getElementById('pgstreams-tail-status').textContent.includes('closed')")


WATCH = """([url, from_offset]) => {
  window.seen = {chunks: [], statuses: [], error: null};
  new PgStream(url, {
    from: from_offset,
    onChunk: (data, offset) => window.seen.chunks.push([offset, data]),
    onStatus: (status) => window.seen.statuses.push(status),
    onError: (error) => { window.seen.error = error; },
  });
}"""


def test_the_js_client_reports_pruned_chunks_and_does_not_reconnect(demo_server: str, page) -> None:
    from tests.helpers import delete_chunks

    s = in_thread(pgstreams.create_stream)
    in_thread(pgstreams.write_many, s.id, [f"t{i}" for i in range(10)])
    in_thread(delete_chunks, s.id, 0, 5)
    page.goto(f"http://{demo_server}/accounts/login/")
    page.add_script_tag(url="/static/pgstreams/pgstreams.js")
    page.evaluate(WATCH, [f"/ws/pgstreams/{s.id}/", 2])
    page.wait_for_function("window.seen.error !== null")
    page.wait_for_timeout(1500)  # time enough for a reconnect, were one attempted
    seen = page.evaluate("window.seen")
    assert seen["error"]["code"] == 4410 and seen["error"]["firstOffset"] == 5
    assert "pruned" in seen["error"]["message"] and seen["chunks"] == []
    assert seen["statuses"] == ["connecting", "live", "failed"]


def test_the_js_client_reconnects_once_after_a_gap(page) -> None:
    """A server that skips an offset (which pgstreams never does): the client must resume from
    the chunk it lacks with one new socket, not two."""
    import asyncio

    from websockets.asyncio.server import serve

    paths: list[str] = []

    async def handler(ws) -> None:
        paths.append(ws.request.path)
        if len(paths) == 1:
            items = [{"offset": 0, "data": "a"}, {"offset": 2, "data": "c"}]
            await ws.send(json.dumps({"type": "chunks", "frame": "f", "stream": "s", "items": items}))
        await ws.wait_closed()

    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop = asyncio.Event()
    ports: list[int] = []

    async def run() -> None:
        async with serve(handler, "127.0.0.1", 0) as server:
            ports.append(server.sockets[0].getsockname()[1])
            started.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        page.set_content("<html><body></body></html>")
        page.add_script_tag(path=str(ROOT / "pgstreams/static/pgstreams/pgstreams.js"))
        page.evaluate(WATCH, [f"ws://127.0.0.1:{ports[0]}/", 0])
        page.wait_for_function("window.seen.statuses.filter(s => s === 'live').length >= 2")
        page.wait_for_timeout(1500)  # time enough for a second reconnect, were one scheduled
        seen = page.evaluate("window.seen")
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
    assert seen["chunks"] == [[0, "a"]]
    assert paths == ["/?from=0", "/?from=1"]
