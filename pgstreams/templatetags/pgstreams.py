"""Template tags, ``{% load pgstreams %}``: ``{% stream_html stream %}`` renders a text stream's
chunks so far, escaped, in an element that htmx's SSE extension keeps appending to from the SSE
view (``?format=html``), starting at the next offset, so a reload shows everything once.

The reader is authorized as at the SSE view, by the request in the template's context. The
chunks are read through this process's listener (``pgstreams.read``), in a sync view; nothing
here writes or follows a stream.
"""

from __future__ import annotations

from typing import Any

from django import template
from django.core.exceptions import ImproperlyConfigured
from django.http import Http404
from django.urls import reverse
from django.utils.safestring import mark_safe

from .. import conf
from ..auth import _readable_stream
from ..exceptions import ChunksPruned, StreamNotFound
from ..protocol import html_text
from ..reader import read
from ..types import stream_uuid

register = template.Library()


@register.inclusion_tag("pgstreams/stream_html.html", takes_context=True)
def stream_html(context: template.Context, stream: Any) -> dict[str, Any]:
    """The stream (a Stream or its id) so far, and, while it is open, what htmx needs to follow it.

    Answers as the SSE view would: ``Http404`` for no such stream, ``PermissionDenied`` (403) for
    a reader ``AUTHORIZE`` refuses. The text is escaped here, whatever the template's autoescape,
    as the SSE view escapes what follows; chunks already pruned are left out (the text starts at
    the first chunk kept).
    """
    request = context.get("request")
    if request is None:
        raise ImproperlyConfigured(
            "{% stream_html %} authorizes the reader by the request: add "
            "'django.template.context_processors.request' to the template engine's context_processors"
        )
    try:
        sid = stream_uuid(stream)
        found = _readable_stream(getattr(request, "user", None), sid)
    except StreamNotFound as exc:
        raise Http404(str(exc)) from exc
    if not found.holds_text:
        raise ValueError(f"{{% stream_html %}} shows text streams; stream {sid} holds bytes ({found.content_type})")
    end = found.next_offset
    events = reverse("pgstreams:events", kwargs={"stream_id": sid})
    return {
        "stream_id": sid,
        "text": mark_safe(html_text("".join(_text(sid, end)))),  # escaped by html_text
        "events": None if found.is_closed else f"{events}?format=html&from={end}",
    }


def _text(sid: Any, end: int, start: int = 0) -> list[str]:
    """The data of the stream's chunks from ``start`` to ``end``, or from the first kept after it."""
    if start >= end:
        return []
    texts = []
    try:
        # QUERY_TIMEOUT for each chunk: they are committed, and only a lagging READ_DATABASE waits.
        for chunk in read(sid, from_offset=start, timeout=conf.query_timeout()):
            texts.append(chunk.data)
            if chunk.offset + 1 >= end:
                break
    except ChunksPruned as exc:  # pruned while read: what is left from where it resumes
        return texts + _text(sid, end, exc.first_offset)
    return texts
