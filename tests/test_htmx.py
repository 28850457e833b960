"""``{% stream_html %}``: a text stream so far, escaped, in an element htmx's SSE support follows
from the next offset (htmx 4's hx-sse, or htmx 2's htmx-ext-sse); authorized by the request as
the SSE view is. Then the demo's htmx pages in a browser (Debian's Chromium driven by Playwright),
on htmx 4 and htmx 2: an answer across a reload, a response cut off, a connection opened anew,
chunks of white space, the server's errors; and the copies of htmx the demo serves."""

from __future__ import annotations

import json
import re
import uuid

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import Http404
from django.template import Context, Template
from django.test import RequestFactory

import pgstreams
from demo_project.chat import llm
from pgstreams.models import Stream
from pgstreams.templatetags.pgstreams import stream_html
from tests.helpers import ROOT, delete_chunks, in_thread, sign_in, sign_in_and_ask

pytestmark = pytest.mark.django_db(transaction=True)

TEMPLATE = Template("{% load pgstreams %}{% stream_html stream %}")


def render(stream, user=None, template: Template = TEMPLATE) -> str:
    request = RequestFactory().get("/")
    request.user = user or AnonymousUser()
    return template.render(Context({"request": request, "stream": stream}))


def test_an_open_stream_renders_its_text_escaped_and_follows_from_the_next_offset() -> None:
    s = pgstreams.create_stream()
    pgstreams.write_many(s.id, ["<b>tag</b> ", "& more\n"])
    html = render(s.id)
    assert html.strip() == (
        f'<div class="pgstreams-stream" data-pgstreams-stream="{s.id}" hx-ext="sse" '
        f'sse-connect="/pgstreams/streams/{s.id}/events?format=html&amp;from=2" sse-swap="message" '
        'sse-close="end" hx-swap="beforeend">&lt;b&gt;tag&lt;/b&gt; &amp; more\n</div>'
    )


def test_the_text_is_escaped_with_autoescape_off_and_a_carriage_return_as_the_sse_view_sends_it() -> None:
    s = pgstreams.create_stream()
    pgstreams.write_many(s.id, ["<script>alert(1)</script>", "50%\r100%"])
    raw = Template("{% load pgstreams %}{% autoescape off %}{% stream_html stream %}{% endautoescape %}")
    html = render(s.id, template=raw)
    assert ">&lt;script&gt;alert(1)&lt;/script&gt;50%&#13;100%</div>" in html


def test_a_closed_stream_renders_its_text_and_nothing_to_follow() -> None:
    s = pgstreams.create_stream()
    pgstreams.write(s.id, "done")
    pgstreams.close(s.id)
    html = render(s)
    assert ">done</div>" in html and "sse-connect" not in html and "hx-ext" not in html


def test_an_empty_stream_follows_from_offset_zero() -> None:
    s = pgstreams.create_stream()
    assert re.search(r'sse-connect="[^"]*from=0"[^>]*></div>', render(s.id))


def test_pruned_chunks_are_left_out() -> None:
    s = pgstreams.create_stream()
    pgstreams.write_many(s.id, ["a", "b", "c", "d"])
    delete_chunks(s.id, 0, 2)
    assert re.search(r"from=4\"[^>]*>cd</div>", render(s.id))


def test_the_reader_is_authorized_as_at_the_sse_view() -> None:
    owner, other = (get_user_model().objects.create_user(name) for name in ("owner", "other"))
    s = pgstreams.create_stream(owner=owner)
    pgstreams.write(s.id, "mine")
    assert ">mine</div>" in render(s.id, owner)
    for user in (other, None):
        with pytest.raises(PermissionDenied):
            render(s.id, user)
    with pytest.raises(Http404):  # as the SSE view answers
        render("00000000-0000-0000-0000-000000000000")


def test_a_stream_of_bytes_is_refused() -> None:
    s = Stream.objects.create(content_type="application/octet-stream")
    with pytest.raises(ValueError, match="shows text streams; stream .* holds bytes"):
        render(s.id)


def test_without_the_request_in_the_context_it_says_which_context_processor_to_add() -> None:
    s = pgstreams.create_stream()
    with pytest.raises(ImproperlyConfigured, match="django.template.context_processors.request"):
        TEMPLATE.render(Context({"stream": s}))


def shown(html: str) -> str:
    return re.search(r">([^<]*)</div>", html).group(1)


def test_a_long_stream_renders_its_last_chunks_and_follows_from_its_end() -> None:
    """The page held the whole stream: a million chunks, a page of them all. Now the last 10,000."""
    s = pgstreams.create_stream()
    n = 10_000 + 5
    for start in range(0, n, 1000):
        pgstreams.write_many(s.id, [f"{i} " for i in range(start, min(n, start + 1000))])
    html = render(s.id)
    assert shown(html) == "".join(f"{i} " for i in range(5, n)) and f"from={n}" in html


def test_the_last_chunks_rendered_are_bounded_in_bytes_too() -> None:
    """At most 1 MiB of text, in whole chunks."""
    s = pgstreams.create_stream()
    chunk = "é" * 30_000  # 60,000 bytes of UTF-8
    pgstreams.write_many(s.id, [chunk] * 20)
    pgstreams.close(s.id)
    kept = (1 << 20) // 60_000
    assert shown(render(s.id)) == chunk * kept
    one = Template("{% load pgstreams %}{% stream_html stream last_bytes=1 %}")
    assert shown(render(s.id, template=one)) == chunk  # the last chunk at least, whatever its size


def test_last_chooses_how_many_chunks_are_rendered() -> None:
    s = pgstreams.create_stream()
    pgstreams.write_many(s.id, ["a", "b", "c", "d"])
    delete_chunks(s.id, 1, 2)  # a gap: b pruned
    last_two = Template("{% load pgstreams %}{% stream_html stream last=2 %}")
    assert re.search(r"from=4\"[^>]*>cd</div>", render(s.id, template=last_two))
    last_three = Template("{% load pgstreams %}{% stream_html stream last=3 %}")
    assert shown(render(s.id, template=last_three)) == "acd"  # three chunks kept: a, c, d
    request = RequestFactory().get("/")
    request.user = AnonymousUser()
    assert stream_html(Context({"request": request}), s.id, last=2)["first_offset"] == 2  # for a template's own use
    for bad in ("0", "-1", "'x'", "2.5"):
        with pytest.raises(ValueError, match="last must be a positive whole number of chunks"):
            render(s.id, template=Template(f"{{% load pgstreams %}}{{% stream_html stream last={bad} %}}"))


def test_htmx_4_follows_with_the_hx_sse_extensions_attributes() -> None:
    s = pgstreams.create_stream()
    pgstreams.write(s.id, "so far")
    html = render(s.id, template=Template("{% load pgstreams %}{% stream_html stream htmx=4 %}"))
    assert html.strip() == (
        f'<div class="pgstreams-stream" data-pgstreams-stream="{s.id}" '
        f'hx-sse:connect="/pgstreams/streams/{s.id}/events?format=html&amp;from=1" hx-sse:close="end" '
        'hx-swap="beforeend swapEmpty:true">so far</div>'
    )
    pgstreams.close(s.id)
    closed = render(s.id, template=Template("{% load pgstreams %}{% stream_html stream htmx=4 %}"))
    assert ">so far</div>" in closed and "hx-" not in closed
    for bad in ("3", "'4'", "True"):
        with pytest.raises(ValueError, match="htmx is the major version of htmx the page loads, 2 or 4"):
            render(s.id, template=Template(f"{{% load pgstreams %}}{{% stream_html stream htmx={bad} %}}"))


# The demo's htmx pages in a browser, on each major: the demo serves htmx 4 at c/<pk>/htmx/ and
# htmx 2 at c/<pk>/htmx2/, the same template and the same tag.
MAJORS = (4, 2)
PAGE = {4: "htmx", 2: "htmx2"}
# Set window.sseEnded when the extension closes the connection on the stream's end event.
ENDED = """
document.addEventListener('htmx:sseClose', (e) => { if (e.detail.type === 'message') window.sseEnded = true })
document.addEventListener('htmx:sse:close', (e) => { if (e.detail.reason === 'message') window.sseEnded = true })
"""
ELEMENT = "document.querySelector('[data-pgstreams-stream]')"


@pytest.fixture(params=MAJORS, ids=lambda major: f"htmx{major}")
def major(request) -> int:
    return request.param


def open_htmx_page(page, host: str, prompt: str, major: int) -> str:
    """Ask in the chat, then open the answer's htmx page for ``major`` mid-answer; return the
    whole answer."""
    page.add_init_script(ENDED)
    sign_in_and_ask(page, host, prompt)
    page.click(f"#{PAGE[major]}-page")
    page.wait_for_url(f"**/{PAGE[major]}/")
    assert page.evaluate("htmx.version").startswith(f"{major}.")
    return "".join(llm.answer(prompt))


def htmx_text(page) -> str:
    return page.eval_on_selector("[data-pgstreams-stream]", "el => el.textContent")


def wait_for_htmx_growth(page) -> None:
    """Until htmx has swapped in chunks since the page was rendered."""
    start = len(htmx_text(page))
    page.wait_for_function(f"{ELEMENT}.textContent.length > {start + 20}")


def wait_for_htmx_end(page) -> None:
    """Until the extension closed its connection on the end event, or the page rendered a closed
    stream (nothing to follow: no hx-swap)."""
    page.wait_for_function(f"window.sseEnded || !{ELEMENT}.hasAttribute('hx-swap')")


@pytest.mark.multiprocess
def test_the_htmx_page_shows_the_answer_so_far_then_follows_it_across_a_reload(demo_server, page, major) -> None:
    expected = open_htmx_page(page, demo_server, "Stream me into a template with htmx.", major)
    wait_for_htmx_growth(page)
    page.reload()  # mid-answer: Django renders what is committed, htmx follows from the next offset
    wait_for_htmx_end(page)
    assert htmx_text(page) == expected  # nothing lost or repeated


@pytest.mark.multiprocess
def test_the_htmx_page_resumes_after_its_connection_is_cut_mid_event(demo_server, page, major) -> None:
    """The page's first SSE response is the server's own bytes up to the middle of an event, and
    ends there, as a response that a proxy or a restarting server cuts off ends (Playwright
    answers the request with those bytes: the body ends cleanly, no connection is reset). htmx 4's
    extension, or htmx 2's EventSource (the browser), asks the same URL again, so the same
    ``from``, with Last-Event-ID, the id of the last whole event: the server resumes after it, and
    the torn event comes once, nothing twice."""
    cut = CutEvents(after=3)
    page.route("**/pgstreams/streams/*/events?*", cut.handle)
    expected = open_htmx_page(page, demo_server, "Cut my connection mid-answer.", major)
    wait_for_htmx_end(page)
    assert htmx_text(page) == expected
    (first, _), (again, last_event_id) = cut.asked[:2]
    assert again == first  # from= as the page was rendered: only Last-Event-ID says where the page is
    if major == 4:  # set by hx-sse; Chromium adds EventSource's Last-Event-ID below what a route sees
        assert last_event_id == cut.last_whole_id


class CutEvents:
    """A Playwright route for the page's SSE requests: the first is answered with what the server
    sends, read here, up to the middle of the data of the event after ``after`` whole ones, and
    then ends; the others go on to the server. ``asked`` holds the URL and the Last-Event-ID (or
    None) of each request, ``last_whole_id`` the id of the last whole event the first one got."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.asked: list[tuple[str, str | None]] = []
        self.last_whole_id: str | None = None

    def handle(self, route) -> None:
        headers = route.request.all_headers()
        self.asked.append((route.request.url, headers.get("last-event-id")))
        if len(self.asked) > 1:
            route.continue_()
            return
        body, events = b"", []
        with httpx.stream("GET", route.request.url, headers=headers, timeout=20) as response:
            assert response.status_code == 200, response.status_code
            for part in response.iter_raw():
                body += part
                events = [event for event in body.split(b"\n\n")[:-1] if event.startswith(b"id: ")]
                if len(events) > self.after:
                    break
            else:
                raise AssertionError(f"the response ended after {len(events)} events: {body!r}")
        torn = events[self.after]
        cut_at = body.index(torn) + torn.index(b"\ndata: ") + len(b"\ndata: ") + 1  # one byte of its data
        self.last_whole_id = events[self.after - 1].split(b"\n", 1)[0].removeprefix(b"id: ").decode()
        route.fulfill(status=200, headers=dict(response.headers), body=body[:cut_at])


@pytest.mark.multiprocess
def test_a_new_connection_from_the_elements_attribute_resumes_where_its_text_ends(demo_server, page, major) -> None:
    """The extension opens a connection anew from the element's attribute: htmx 2's when the
    browser gave up reconnecting (CLOSED: an error status, say), htmx 4's when the element, taken
    out of the page (its connection closed) and put back, is processed again. pgstreams/htmx.js
    keeps the attribute at the next offset; without it the chunks swapped in since the page
    loaded come again."""
    expected = open_htmx_page(page, demo_server, "Resume me from the attribute.", major)
    wait_for_htmx_growth(page)
    if major == 2:
        page.evaluate(
            f"""() => {{
                const source = {ELEMENT}['htmx-internal-data'].sseEventSource;
                source.close();
                source.onerror(new Event('error'));  // as the browser reports a failed reconnection
            }}"""
        )
    else:
        page.evaluate(
            f"""async () => {{
                const element = {ELEMENT}, parent = element.parentNode, next = element.nextSibling;
                const closed = new Promise((resolve) => document.addEventListener('htmx:sse:close', resolve));
                element.remove();  // hx-sse ends its connection at the next message
                await closed;
                parent.insertBefore(element, next);
                htmx.process(element);
            }}"""
        )
    wait_for_htmx_end(page)
    assert htmx_text(page) == expected


def own_answer(prompt: str) -> tuple[int, uuid.UUID]:
    """A conversation of the demo user's whose stream the test writes; returns (its pk, the stream's id)."""
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from demo_project.chat.models import Conversation

    user = get_user_model().objects.get(username=settings.DEMO_USERNAME)
    s = pgstreams.create_stream(owner=user)
    return Conversation.objects.create(user=user, prompt=prompt, stream=s).pk, s.id


@pytest.mark.multiprocess
def test_chunks_of_white_space_alone_are_swapped_in_too(demo_server, page, major) -> None:
    """htmx 4 swaps nothing for a message whose HTML is only white space, unless the element's
    hx-swap says swapEmpty:true; a token can be a space or a line break."""
    pk, sid = in_thread(own_answer, "Spaces and line breaks, please.")
    page.add_init_script(ENDED)
    sign_in(page, demo_server)
    page.goto(f"http://{demo_server}/c/{pk}/{PAGE[major]}/")
    chunks = ["a", " ", "\n", "b", "\r\n", " \t ", "&", " <i>", "\n\n", " "]
    in_thread(pgstreams.write_many, sid, chunks)
    in_thread(pgstreams.close, sid)
    wait_for_htmx_end(page)
    assert htmx_text(page) == "".join(chunks)


@pytest.mark.multiprocess
def test_htmx_4_ends_the_reading_on_an_error_the_server_sent(demo_server, page) -> None:
    """The stream deleted while read: the server sends an ``error`` event and ends the response.
    hx-sse would connect again, get a 404, and try again for ever with a growing delay;
    pgstreams/htmx.js ends the connection, and the page sees the error as a DOM event."""
    pk, sid = in_thread(own_answer, "Delete me while I am read.")
    page.add_init_script(
        "document.addEventListener('htmx:sse:close', (e) => { window.sseClosed = e.detail.reason });"
        "document.addEventListener('error', (e) => { if (e.detail) window.sseError = e.detail.data }, true)"
    )
    sign_in(page, demo_server)
    page.goto(f"http://{demo_server}/c/{pk}/htmx/")
    in_thread(pgstreams.write, sid, "read")
    page.wait_for_function(f"{ELEMENT}.textContent === 'read'")
    in_thread(lambda: Stream.objects.filter(pk=sid).delete())
    page.wait_for_function("window.sseClosed !== undefined")
    assert page.evaluate("window.sseClosed") == "ended"
    assert json.loads(page.evaluate("window.sseError"))["message"] == "the stream was deleted"


@pytest.mark.multiprocess
def test_htmx_4_swaps_no_error_page_into_the_text(demo_server, page) -> None:
    """htmx 4 swaps the body of an answer that is no event stream, as content: the stream deleted
    between the page and its connection, the SSE view's 404 ("no stream ...") went into the
    answer's text. pgstreams/htmx.js leaves the text as it was."""
    pk, sid = in_thread(own_answer, "Delete me before I am followed.")
    in_thread(pgstreams.write, sid, "so far")

    def delete_first(route) -> None:
        in_thread(lambda: Stream.objects.filter(pk=sid).delete())
        route.continue_()

    page.route("**/pgstreams/streams/*/events?*", delete_first)
    page.add_init_script(
        "document.addEventListener('htmx:response:error', (e) => { window.failed = e.detail.ctx.response.status });"
        "document.addEventListener('htmx:finally:request', () => { window.finished = true })"
    )
    sign_in(page, demo_server)
    page.goto(f"http://{demo_server}/c/{pk}/htmx/")
    page.wait_for_function("window.finished")
    assert page.evaluate("window.failed") == 404
    assert htmx_text(page) == "so far"


@pytest.mark.multiprocess
def test_htmx_2_closes_its_event_source_on_an_error_the_server_sent(demo_server, page) -> None:
    """pgstreams/htmx.js: an ``error`` event (the stream deleted, its chunks pruned) ends the
    reading; a failed connection (a plain Event) is left to the browser and the extension."""
    open_htmx_page(page, demo_server, "Stop on the server's error.", 2)
    source = f"{ELEMENT}['htmx-internal-data'].sseEventSource"
    state = f"""(error) => {{
        const source = {source};
        source.dispatchEvent(error ? new MessageEvent('error', {{data: '{{"message": "gone"}}'}}) : new Event('error'));
        return source.readyState;
    }}"""
    page.wait_for_function(f"{source}.readyState === 1")
    assert page.evaluate(state, False) == 1  # OPEN: a connection's failure, the browser's to retry
    assert page.evaluate(state, True) == 2  # CLOSED


def test_the_vendored_htmx_is_the_pinned_packages() -> None:
    """The demo's copies of htmx 4 with its hx-sse extension, and of htmx 2 with htmx-ext-sse, are
    what `npm run vendor-htmx` makes of the versions node/package.json pins."""
    modules = ROOT / "node" / "node_modules"
    if not (modules / "htmx.org").is_dir():
        pytest.skip("node/node_modules is not installed (cd node && npm ci)")
    vendored = ROOT / "demo_project" / "chat" / "static" / "chat" / "vendor"
    pinned = json.loads((ROOT / "node" / "package.json").read_text())["devDependencies"]
    for package, major, licence, scripts in [
        (
            "htmx.org",
            "4.",
            "htmx-4",
            {"dist/htmx.min.js": "htmx-4.min.js", "dist/ext/hx-sse.min.js": "htmx-4-hx-sse.min.js"},
        ),
        ("htmx.org-2", "2.", "htmx", {"dist/htmx.min.js": "htmx.min.js"}),
        ("htmx-ext-sse", "2.", "htmx-ext-sse", {"dist/sse.min.js": "htmx-ext-sse.js"}),
    ]:
        installed = json.loads((modules / package / "package.json").read_text())["version"]
        assert pinned[package].rsplit("@", 1)[-1] == installed, f"node_modules holds {package} {installed}: npm ci"
        assert installed.startswith(major), f"{package} is {installed}, not htmx {major}x"
        for script, copy in scripts.items():
            assert (vendored / copy).read_bytes() == (modules / package / script).read_bytes(), copy
        assert (vendored / f"{licence}.LICENSE").read_bytes() == (modules / package / "LICENSE").read_bytes()
