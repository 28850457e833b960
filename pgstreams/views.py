"""HTTP views: ``events`` serves a stream as Server-Sent Events, for clients and proxies without
WebSocket and for htmx (no SQL of its own beyond the authorization lookup; chunks come from the
listener), and ``metrics_view`` this process's Prometheus metrics."""

from __future__ import annotations

import contextlib
import hmac
import uuid
from collections.abc import AsyncIterator, Callable, Sequence

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseBase, StreamingHttpResponse

from . import conf, delivery, metrics, protocol
from .auth import arequest_user, readable_stream
from .exceptions import ChunksPruned, StreamNotFound
from .types import StreamChunk

# Seconds of silence after which a comment line keeps proxies from closing the connection.
KEEPALIVE = 15.0
# A response ends without an "end" event after the batch of events that reaches this many bytes
# (a batch is at most a page, fetch.PAGE_BYTES of data, and is sent whole: what was fetched for
# it is sent); the client (EventSource does this by itself) reconnects with Last-Event-ID. This
# bounds what a client that stops reading can hold in the server's send buffers.
RESPONSE_BYTES = 1 << 20


def metrics_view(request: HttpRequest) -> HttpResponse:
    """``GET metrics/``: this process's Prometheus metrics, for staff or ``Authorization: Bearer
    <PGSTREAMS['METRICS_TOKEN']>``."""
    token = conf.metrics_token()
    offered = request.headers.get("Authorization", "")
    if not (request.user.is_authenticated and request.user.is_staff) and not (
        token and hmac.compare_digest(offered.encode(), f"Bearer {token}".encode())
    ):
        response = HttpResponse("metrics are for staff, or for a bearer of METRICS_TOKEN\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="pgstreams metrics"'
        return response
    body, content_type = metrics.exposition()
    return HttpResponse(body, content_type=content_type)


async def events(request: HttpRequest, stream_id: uuid.UUID) -> HttpResponseBase:
    """``GET streams/<uuid>/events``: one event per chunk, ``id:`` its offset, then ``end``.

    Resumes after ``Last-Event-ID`` (the last offset the client has) or from ``?from=``. An
    event's data is the chunk as JSON, or with ``?format=html`` (a text stream) its text escaped
    for HTML, for htmx's SSE extension. Every answer is ``_secured``.
    """
    return _secured(await _events_response(request, stream_id))


def _secured(response: HttpResponseBase) -> HttpResponseBase:
    """No MIME sniffing, whatever the project's SecurityMiddleware says: a writer's text in
    ``text/event-stream`` can read as JavaScript (``data: <text>`` is a labelled statement), which
    a browser would run from a page's ``<script src>`` if it sniffed; and opened in a tab, nothing
    runs (as at the Durable Streams endpoint)."""
    for header, value in protocol.UNTRUSTED_CONTENT_HEADERS.items():
        response[header] = value
    return response


async def _events_response(request: HttpRequest, stream_id: uuid.UUID) -> HttpResponseBase:
    try:
        last_seen = request.headers.get("Last-Event-ID")
        if last_seen is not None:
            start = protocol.parse_offset([last_seen], "Last-Event-ID") + 1
        else:
            start = protocol.parse_offset(request.GET.getlist("from"), "from")
        kind, encode = _format(request.GET.getlist("format"))
    except ValueError as exc:
        return HttpResponseBadRequest(f"{exc}\n", content_type="text/plain")
    try:
        stream = await readable_stream(await arequest_user(request), stream_id)
    except StreamNotFound:
        return HttpResponse(f"no stream {stream_id}\n", status=404, content_type="text/plain")
    except PermissionDenied:
        return HttpResponse(f"not allowed to read stream {stream_id}\n", status=403, content_type="text/plain")
    if start > stream.next_offset:
        return HttpResponseBadRequest(f"{protocol.past_end(start, stream)}\n", content_type="text/plain")
    if encode is _html_events and not stream.holds_text:
        message = f"format=html is for text streams; stream {stream_id} holds bytes ({stream.content_type})"
        return HttpResponseBadRequest(f"{message}\n", content_type="text/plain")
    body = delivery.ending_on_error(
        _event_stream(stream_id, start, kind, encode), f"the SSE response of stream {stream_id}"
    )
    response = StreamingHttpResponse(body, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: do not buffer the stream
    return response


async def _event_stream(stream_id: uuid.UUID, position: int, kind: str, encode: Encode) -> AsyncIterator[bytes]:
    metrics.sse_clients.inc()
    try:
        async for part in _events(stream_id, position, kind, encode):
            yield part
    finally:
        metrics.sse_clients.dec()


def _json_events(chunks: Sequence[StreamChunk]) -> bytes:
    return b"".join(map(protocol.sse_chunk, chunks))


def _html_events(chunks: Sequence[StreamChunk]) -> bytes:
    return b"".join(map(protocol.sse_html_chunk, chunks))


Encode = Callable[[Sequence[StreamChunk]], bytes]
# ?format= -> the kind its events are shared under (delivery.shared), and how they are made.
_FORMATS: dict[str, tuple[str, Encode]] = {"json": ("sse", _json_events), "html": ("sse-html", _html_events)}


def _format(values: list[str]) -> tuple[str, Encode]:
    if len(values) > 1:
        raise ValueError(f"give 'format' once, not {len(values)} times")
    name = values[0] if values else "json"
    if name not in _FORMATS:
        raise ValueError(f"format is 'json' (the default) or 'html', not {name[:40]!r}")
    return _FORMATS[name]


async def _events(stream_id: uuid.UUID, position: int, kind: str, encode: Encode) -> AsyncIterator[bytes]:
    """The stream's chunks as events from ``position``, through the stream's fan once at its
    tail (``delivery.afollow``), a comment after KEEPALIVE seconds of silence; ends after the
    batch that reaches RESPONSE_BYTES (the client resumes from Last-Event-ID), or with an
    ``end`` or ``error``."""
    yield protocol.SSE_RETRY
    sent = 0
    try:
        async with contextlib.aclosing(delivery.afollow(stream_id, from_offset=position, idle=KEEPALIVE)) as batches:
            async for progress in batches:
                batch = progress.chunks
                if not batch:
                    yield protocol.SSE_KEEPALIVE
                    continue
                events = delivery.shared(kind, batch, encode)  # as every subscriber at it sends it
                yield events
                position = batch[-1].offset + 1
                sent += len(events)
                if sent >= RESPONSE_BYTES:
                    return  # the client resumes from Last-Event-ID
    except StreamNotFound:
        yield protocol.sse_error("the stream was deleted")
        return
    except ChunksPruned as exc:
        yield protocol.sse_error(str(exc), first_offset=exc.first_offset)
        return
    yield protocol.sse_end(position)
