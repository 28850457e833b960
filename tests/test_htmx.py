"""``{% stream_html %}``: a text stream so far, escaped, in an element htmx's SSE support follows
from the next offset (htmx 4's hx-sse, or htmx 2's htmx-ext-sse); authorized by the request as
the SSE view is. The page in a browser is in test_demo.py."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import Http404
from django.template import Context, Template
from django.test import RequestFactory

import pgstreams
from pgstreams.models import Stream
from pgstreams.templatetags.pgstreams import stream_html
from tests.helpers import delete_chunks

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
