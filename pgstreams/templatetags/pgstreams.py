"""Template tags, ``{% load pgstreams %}``: ``{% stream_html stream %}`` renders a text stream's
last chunks so far (``LAST_CHUNKS`` and ``LAST_BYTES`` at most, or ``last=`` and ``last_bytes=``),
escaped, in an element that htmx's SSE support keeps appending to from the SSE view
(``?format=html``), starting at the next offset, so a reload shows them and what follows once.
The element's attributes are htmx 2's SSE extension's (``htmx-ext-sse``), or with ``htmx=4``
those of htmx 4's ``hx-sse`` extension.

The reader is authorized as at the SSE view, by the request in the template's context. One
query measures the stream's last chunks (their offsets and sizes, not their text) to find where
the page starts; the chunks are read from there through this process's listener
(``pgstreams.read``), in a sync view. Nothing here writes or follows a stream.
"""

from __future__ import annotations

from itertools import islice
from typing import Any, Final

from django import template
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.http import Http404
from django.urls import reverse
from django.utils.safestring import mark_safe

from .. import conf, runs
from ..auth import _readable_stream
from ..exceptions import ChunksPruned, StreamNotFound
from ..protocol import html_text
from ..reader import read
from ..types import stream_uuid

register = template.Library()

# What a page renders of a stream at most: its last chunks, and of them those whose text (in
# UTF-8) fits in the bytes, the last one at least. Earlier text is left out.
LAST_CHUNKS: Final = 10_000
LAST_BYTES: Final = 1 << 20
# The htmx majors whose SSE support the element's attributes can be written for.
HTMX_MAJORS: Final = (2, 4)


@register.inclusion_tag("pgstreams/stream_html.html", takes_context=True)
def stream_html(
    context: template.Context, stream: Any, last: int = LAST_CHUNKS, last_bytes: int = LAST_BYTES, htmx: int = 2
) -> dict[str, Any]:
    """The stream's (a Stream or its id) last chunks so far, at most ``last`` of them and
    ``last_bytes`` of their text (the last chunk at least), and, while it is open, what htmx
    needs to follow it: the attributes of htmx 2's SSE extension, or with ``htmx=4`` of htmx 4's
    ``hx-sse``. The template also gets ``first_offset``, the offset of the first chunk shown, and
    ``htmx``, the major.

    Answers as the SSE view would: ``Http404`` for no such stream, ``PermissionDenied`` (403) for
    a reader ``AUTHORIZE`` refuses. The text is escaped here, whatever the template's autoescape,
    as the SSE view escapes what follows; chunks already pruned are left out (the text starts at
    the first chunk kept).
    """
    for name, value, what in (("last", last, "chunks"), ("last_bytes", last_bytes, "bytes")):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{{% stream_html %}}'s {name} must be a positive whole number of {what}, not {value!r}")
    if isinstance(htmx, bool) or not isinstance(htmx, int) or htmx not in HTMX_MAJORS:
        raise ValueError(
            f"{{% stream_html %}}'s htmx is the major version of htmx the page loads, 2 or 4, not {htmx!r}"
        )
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
    start = _start(sid, end, last, last_bytes)
    events = reverse("pgstreams:events", kwargs={"stream_id": sid})
    return {
        "stream_id": sid,
        "first_offset": start,
        "text": mark_safe(html_text("".join(_text(sid, end, start)))),  # escaped by html_text
        "events": None if found.is_closed else f"{events}?format=html&from={end}",
        "htmx": htmx,
    }


# The rows below an offset, the last first: each one's offset and size, a run's (runs.py) its
# chunks' lengths, from its index, its data left where it is.
_SIZES_SQL = (
    'SELECT "offset", octet_length(data), run FROM pgstreams_chunk'
    ' WHERE stream_id = %s AND "offset" < %s ORDER BY "offset" DESC LIMIT %s'
)


def _start(sid: Any, end: int, last: int, last_bytes: int) -> int:
    """Where the page starts: the offset of the first of the last chunks below ``end`` (at most
    ``last``) whose text fits in ``last_bytes``, the last chunk at least; ``end`` if none."""
    with connections[conf.database()].cursor() as cursor:
        cursor.execute(_SIZES_SQL, [sid, end, last])
        rows = cursor.fetchall()
    sizes = (
        (offset - back, size)
        for offset, size, run in rows
        for back, size in enumerate(reversed(runs.lengths(run)) if run is not None else [size])
    )
    start, total = end, 0
    for offset, size in islice(sizes, last):
        total += size or 0
        if total > last_bytes and start < end:
            break
        start = offset
    return start


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
