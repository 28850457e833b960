"""The Durable Streams endpoint, ``v1/stream/<path>``: one async view that answers the protocol's
PUT (create, fork), POST (append, close), DELETE, HEAD and GET (catch-up, long-poll, SSE).

Headers are checked here (``wire``); the database work runs on pgstreams' threads (``store``),
but for appends, which are committed in batches by the process's appender (``appends``).
Long-poll and SSE wait on the process's listener, as ``aread()`` does: a waiting request holds no
database connection; one that waits in silence on a leased stream ends it if its writer's lease
has run out (``leases``). No subscription APIs (``__ds/...``), and no CORS origin policy of its own:
a project that serves other origins adds one (django-cors-headers), as for any other view.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import cache, partial
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.urls import reverse
from django.utils.encoding import escape_uri_path
from django.views.decorators.csrf import csrf_exempt

from .. import conf, db, delivery, leases, metrics, protocol, threads
from ..auth import arequest_user
from ..exceptions import ChunksPruned, ReadTimeout, StreamNotFound
from ..reader import afollow
from ..types import StreamChunk
from . import appends, creates, store, wire
from .wire import Refused

# An SSE response ends after about this many seconds (the protocol asks for about a minute, so
# that caches can collapse readers; up to KEEPALIVE more when it is quiet); the client resumes
# from the last control event's offset.
SSE_SECONDS = 60.0
# Seconds of silence after which an SSE response sends a comment, so proxies keep it open.
KEEPALIVE = 15.0
# An SSE response also ends, after a control event, once it has sent about this many bytes: what
# a client that stops reading can hold in the server's send buffers (the client resumes).
SSE_BYTES = 1 << 20

_REQUEST_HEADERS = (
    "Content-Type, Stream-TTL, Stream-Expires-At, Stream-Seq, Stream-Closed, Stream-Forked-From, "
    "Stream-Fork-Offset, Stream-Fork-Sub-Offset, Producer-Id, Producer-Epoch, Producer-Seq, If-None-Match, "
    "Authorization"
)
_RESPONSE_HEADERS = (
    "Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, Stream-TTL, Stream-Expires-At, "
    "Stream-SSE-Data-Encoding, Producer-Epoch, Producer-Seq, Producer-Expected-Seq, Producer-Received-Seq, "
    "ETag, Location"
)
_METHODS = "GET, HEAD, PUT, POST, DELETE, OPTIONS"
T = TypeVar("T")
_CACHEABLE = "private, max-age=60, stale-while-revalidate=300"

# Creates and deletes may wait on a stream's row lock: on threads of their own, so that reads never
# wait for a thread behind them, and for a short while only (``_write``). Appends and plain
# creates hold no thread while they wait for their batch (``appends``, ``creates.plain``).
_create = threads.durable_writes.wrap(creates.create)
_delete = threads.durable_writes.wrap(store.delete)
_head = threads.durable.wrap(store.head)
_read = threads.durable.wrap(store.read)
_csrf_check = threads.durable.wrap(CsrfViewMiddleware(lambda r: HttpResponse()).process_view)


@csrf_exempt  # checked below, for every request that may carry someone's authority
async def stream(request: HttpRequest, path: str) -> HttpResponseBase:
    try:
        name = wire.stream_path(path)
        if request.method == "OPTIONS":
            response: HttpResponseBase = _preflight()
        else:
            _check_destination(request)
            refused = await _csrf_refusal(request)
            if refused is not None:
                return _secured(refused)
            response = await _handle(request, name)
    except Refused as refusal:
        response = HttpResponse(f"{refusal.message}\n", status=refusal.status, content_type="text/plain; charset=utf-8")
        for header, value in refusal.headers.items():
            response[header] = value
    return _secured(response)


async def _write(call: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """A write, tried again while another transaction holds its stream's row (``store.Busy``),
    with no thread held between tries, until QUERY_TIMEOUT has passed (then 503)."""
    deadline = time.monotonic() + conf.query_timeout()
    backoff = db.Backoff(first=0.02, cap=0.25)
    while True:
        try:
            return await call(*args, **kwargs)
        except store.Busy:
            pause = backoff.next()
            if time.monotonic() + pause >= deadline:
                raise
            await asyncio.sleep(pause)


async def _handle(request: HttpRequest, name: str) -> HttpResponseBase:
    if request.method == "PUT":
        return await _put(request, name)
    if request.method == "POST":
        return await _post(request, name)
    if request.method == "DELETE":
        await _write(_delete, request, name)
        return _empty(204)
    if request.method == "HEAD":
        response = _empty(200)
        _describe(response, await _head(request, name))
        response["Cache-Control"] = "no-store"
        return response
    if request.method == "GET":
        return await _get(request, name)
    response = HttpResponse(f"{request.method} is not a Durable Streams method\n", status=405)
    response["Allow"] = _METHODS
    return response


async def _csrf_refusal(request: HttpRequest) -> HttpResponseBase | None:
    """Django's CSRF check (CsrfViewMiddleware's own, so its answer is Django's) for every
    writing request but those no page of another site can make a browser send with someone's
    authority: without a cookie, and with either a token in ``Authorization`` (a scheme a browser
    never sends by itself: ``Bearer``, ``Token``...) or nothing that identifies anyone (no
    ``Authorization``, and nobody signed in by the project's middleware). So a user signed in by
    a cookie, by HTTP authentication (Basic, Digest, Negotiate, NTLM) or by a front proxy's
    header (``RemoteUserMiddleware``) is checked as a form's POST is. The body is read first, so
    that the check never parses it as a form."""
    if request.method in ("GET", "HEAD"):
        return None
    scheme = ((_Headers(request).get("Authorization") or "").split(None, 1) or [""])[0].lower()
    if not request.COOKIES and scheme not in _AMBIENT_SCHEMES:
        if scheme or not _signed_in(await arequest_user(request)):
            return None
    _body(request)
    return await _csrf_check(request, None, (), {})


# The Authorization schemes a browser sends by itself once a site has asked for them, also in
# requests that a page of another site makes it send.
_AMBIENT_SCHEMES = frozenset({"basic", "digest", "negotiate", "ntlm"})


def _signed_in(user: Any) -> bool:
    return user is not None and bool(user.is_authenticated)


# Where a browser may use a stream's body (Sec-Fetch-Dest): as data (fetch, EventSource, a JSON
# module), as a document of its own (a tab, a frame, an object: sandboxed by the CSP every answer
# carries), as media. Never as a script, a worker, a style sheet, an XSLT or a manifest of a page:
# a stream's content type is its creator's (text/javascript, text/css), and a page of this site
# would run or apply it as the site's own, whatever its CSP allows of 'self'.
_DESTINATIONS = frozenset(
    {"empty", "json", "document", "iframe", "frame", "object", "embed", "image", "audio", "video", "track", "font"}
)


def _check_destination(request: HttpRequest) -> None:
    """Refuse (403) a request a browser makes to load a stream as a script, a style sheet or the
    like (its ``Sec-Fetch-Dest``); other clients send no such header."""
    destination = _Headers(request).get("Sec-Fetch-Dest")
    if destination is not None and destination.lower() not in _DESTINATIONS:
        raise Refused(
            403,
            f"a stream is data, never a page's {destination[:40]!r} (Sec-Fetch-Dest): its content type is its "
            "creator's choice; read it with fetch() or EventSource",
        )


class _Headers:
    """A request's headers, read from its META by name as Django's ``request.headers`` reads them,
    without building that mapping, which copies every header of the request (about a twelfth of
    a create's server CPU) for the few the endpoint reads."""

    __slots__ = ("_meta",)

    def __init__(self, request: HttpRequest) -> None:
        self._meta = request.META

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._meta.get(_meta_key(name), default)


@cache
def _meta_key(name: str) -> str:
    key = name.upper().replace("-", "_")
    return key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else f"HTTP_{key}"


def _secured(response: HttpResponseBase) -> HttpResponseBase:
    """The headers every answer carries: no MIME sniffing; a stream opened in a tab (its content
    type is its creator's choice: HTML, SVG) runs nothing, in a sandbox without the site's
    origin; fetchable from other origins that the project's CORS policy lets in, and which
    protocol headers their scripts may read."""
    for header, value in protocol.UNTRUSTED_CONTENT_HEADERS.items():
        response[header] = value
    if not response.streaming and response.status_code not in (204, 304):
        response["Content-Length"] = str(len(response.content))  # as Django's CommonMiddleware would
    response["Cross-Origin-Resource-Policy"] = "cross-origin"
    response["Access-Control-Expose-Headers"] = _RESPONSE_HEADERS
    return response


def _preflight() -> HttpResponse:
    response = _empty(204)
    response["Access-Control-Allow-Methods"] = _METHODS
    response["Access-Control-Allow-Headers"] = _REQUEST_HEADERS + ", X-CSRFToken"
    response["Access-Control-Max-Age"] = "600"
    return response


def _empty(status: int) -> HttpResponse:
    response = HttpResponse(status=status)
    del response["Content-Type"]
    return response


def _describe(response: HttpResponseBase, state: store.State) -> None:
    """The stream's metadata headers, as HEAD, PUT and POST answer them."""
    response["Content-Type"] = state.content_type
    response["Stream-Next-Offset"] = wire.format_offset(state.next_offset)
    if state.ttl is not None:
        response["Stream-TTL"] = str(state.ttl)
    if state.expires_at is not None:
        response["Stream-Expires-At"] = state.expires_at.isoformat().replace("+00:00", "Z")
    if state.closed:
        response["Stream-Closed"] = "true"


def _body(request: HttpRequest) -> bytes:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    too_big = Refused(413, f"the body is over {limit} bytes (settings.DATA_UPLOAD_MAX_MEMORY_SIZE); send it in parts")
    length = request.META.get("CONTENT_LENGTH") or "0"
    if not wire.digits(length):
        raise Refused(400, f"Content-Length {length[:40]!r} is not a number of bytes")
    if limit is not None and (len(length) > 18 or int(length) > limit):
        raise too_big
    try:
        return request.body
    except RequestDataTooBig:
        raise too_big from None


def _fork(request: HttpRequest) -> creates.Fork | None:
    headers = _Headers(request)
    source = headers.get("Stream-Forked-From")
    offset = headers.get("Stream-Fork-Offset")
    sub_offset = headers.get("Stream-Fork-Sub-Offset")
    if source is None:
        if offset is not None or sub_offset is not None:
            raise Refused(400, "Stream-Fork-Offset and Stream-Fork-Sub-Offset need Stream-Forked-From")
        return None
    sub = 0 if sub_offset is None else wire.whole(sub_offset, "Stream-Fork-Sub-Offset")
    if sub and offset is None:
        raise Refused(400, "Stream-Fork-Sub-Offset needs Stream-Fork-Offset")
    at = None if offset is None else wire.parse_offset(offset, "Stream-Fork-Offset")
    return creates.Fork(_source_path(request, source), at, sub)


def endpoint_root() -> str:
    """Where the endpoint is mounted: the URL path its streams' paths follow."""
    return reverse("pgstreams:durable-stream", kwargs={"path": "-"})[:-1]


def _source_path(request: HttpRequest, value: str) -> str:
    """Stream-Forked-From as a path: a path under this endpoint (with or without the project's
    prefix, as clients send ``/v1/stream/<path>``), a URL of this server, or the path itself."""
    try:
        url = urlsplit(value.strip())
    except ValueError:
        raise Refused(400, f"Stream-Forked-From {value[:80]!r} is not a path") from None
    if url.netloc and url.netloc != request.get_host():
        raise Refused(400, "Stream-Forked-From names a stream of another server; fork streams of this one")
    path = unquote(url.path)
    for prefix in (endpoint_root(), "/v1/stream/"):
        if path.startswith(prefix):
            return wire.stream_path(path[len(prefix) :])
    return wire.stream_path(path.lstrip("/"))


async def _put(request: HttpRequest, name: str) -> HttpResponse:
    headers = _Headers(request)
    ttl, expires_at = wire.expiry(headers.get("Stream-TTL"), headers.get("Stream-Expires-At"))
    wanted = creates.Wanted(
        content_type=wire.content_type(headers.get("Content-Type")),
        ttl=ttl,
        expires_at=expires_at,
        closed=wire.flag(headers.get("Stream-Closed")),
        fork=_fork(request),
    )
    body = _body(request)
    state, created = await creates.plain(request, name, wanted, body), True
    if state is None:  # not plain, or its path taken: the long way
        state, created = await _write(_create, request, name, wanted, body)
    response = _empty(201 if created else 200)
    _describe(response, state)
    if created:
        response["Location"] = _location(request)
    return response


def _location(request: HttpRequest) -> str:
    """The URL of the stream a request created: its own, with its path escaped (a name's ``?``,
    ``#`` or ``%`` would end the path or name another stream) and taken as it is (not resolved
    against anything: ``build_absolute_uri`` reads a query and a fragment in it)."""
    return f"{request.scheme}://{request.get_host()}{escape_uri_path(request.path)}"


async def _post(request: HttpRequest, name: str) -> HttpResponse:
    headers = _Headers(request)
    closing = wire.flag(headers.get("Stream-Closed"))
    producer = wire.producer(headers)
    body = _body(request)
    content_type = wire.content_type(headers.get("Content-Type"))
    if not body and not closing:
        raise Refused(400, "an append needs a body (or Stream-Closed: true to close the stream)")
    if body and not content_type:
        raise Refused(400, "an append needs the stream's Content-Type")
    appended = await appends.post(
        request,
        name,
        body,
        content_type=content_type,
        closing=closing,
        producer=producer,
        writer_seq=headers.get("Stream-Seq"),
    )
    response = _empty(appended.status)
    response["Stream-Next-Offset"] = wire.format_offset(appended.state.next_offset)
    if appended.state.closed:
        response["Stream-Closed"] = "true"
    if appended.producer is not None:
        response["Producer-Epoch"], response["Producer-Seq"] = map(str, appended.producer)
    return response


async def _get(request: HttpRequest, name: str) -> HttpResponseBase:
    live = request.GET.get("live")
    if live not in (None, "long-poll", "sse"):
        raise Refused(400, f"live must be long-poll or sse, not {live[:40]!r}")
    if live is not None and "offset" not in request.GET:
        raise Refused(400, f"live={live} needs an offset (-1 for the start, now for the tail)")
    offset = wire.read_offset(request.GET.getlist("offset"))
    read = await _read(request, name, offset)
    cursor_given = request.GET.get("cursor")
    if live == "sse":
        return _sse(read, cursor_given)
    if live is None:
        return _catch_up(request, read, offset)
    if read.chunks:
        response = _read_response(read)
        return _live_headers(response, "Stream-Closed" in response, cursor_given)
    if read.state.closed:
        return _tail_response(read.state, read.start, cursor_given)
    return await _long_poll(read, cursor_given)


def _catch_up(request: HttpRequest, read: store.Read, offset: str) -> HttpResponse:
    state = read.state
    at_end = state.closed and read.up_to_date
    tag = wire.etag(state.id, read.start, read.end, at_end)
    if offset != wire.NOW and wire.etag_matches(tag, _Headers(request).get("If-None-Match")):
        response = _empty(304)
        response["ETag"] = tag
        return response
    response = _read_response(read)
    if offset == wire.NOW:
        response["Cache-Control"] = "no-store"
        del response["ETag"]
    else:
        response["Cache-Control"] = "no-store" if read.up_to_date else _CACHEABLE
    return response


def _read_response(read: store.Read) -> HttpResponse:
    return _chunks_response(
        read.state, read.start, read.end, wire.body_of(read.chunks, read.state.json_mode), read.up_to_date
    )


def _chunks_response(
    state: store.State, start: int, end: int, body: bytes, up_to_date: bool, closed: bool | None = None
) -> HttpResponse:
    """200 with ``body``, the chunks from offset ``start`` to ``end``; whether they end the
    stream, if not said, from ``state``."""
    if closed is None:
        closed = state.closed and end >= state.next_offset
    response = HttpResponse(body, content_type=state.content_type)
    response["Stream-Next-Offset"] = wire.format_offset(end)
    response["ETag"] = wire.etag(state.id, start, end, closed)
    if up_to_date or closed:
        response["Stream-Up-To-Date"] = "true"
    if closed:
        response["Stream-Closed"] = "true"
    return response


def _live_headers(response: HttpResponse, closed: bool, cursor_given: str | None) -> HttpResponse:
    if not closed:
        response["Stream-Cursor"] = wire.cursor(cursor_given)
    response["Cache-Control"] = "no-store"
    return response


def _tail_response(state: store.State, position: int, cursor_given: str | None) -> HttpResponse:
    """204: nothing new at ``position`` (the stream's tail), and whether nothing ever will be."""
    response = _empty(204)
    response["Stream-Next-Offset"] = wire.format_offset(position)
    response["Stream-Up-To-Date"] = "true"
    if state.closed:
        response["Stream-Closed"] = "true"
    return _live_headers(response, state.closed, cursor_given)


async def _long_poll(read: store.Read, cursor_given: str | None) -> HttpResponse:
    state = read.state
    try:
        async with contextlib.aclosing(
            afollow(state.id, from_offset=read.start, timeout=conf.long_poll_timeout())
        ) as batches:
            progress = await anext(batches, None)
    except ReadTimeout:
        if state.leased:  # its next poll sees the end, if this ended it
            await leases.aend_if_expired(state.id)
        return _tail_response(state, read.start, cursor_given)
    except StreamNotFound:
        raise Refused(404, "the stream was deleted") from None
    except ChunksPruned as exc:
        raise Refused(410, str(exc)) from None
    if progress is None:  # closed, with nothing after read.start
        return _tail_response(dataclasses.replace(state, next_offset=read.start, closed=True), read.start, cursor_given)
    body = delivery.shared(f"ds-body/{state.json_mode}", progress.chunks, partial(_body_of, state.json_mode))
    start, end = progress.chunks[0].offset, progress.chunks[-1].offset + 1
    response = _chunks_response(state, start, end, body, progress.caught_up, progress.closed)
    return _live_headers(response, progress.closed, cursor_given)


def _sse(read: store.Read, cursor_given: str | None) -> StreamingHttpResponse:
    body = delivery.ending_on_error(
        _events(read, wire.cursor(cursor_given)), f"the Durable Streams SSE response of stream {read.state.id}"
    )
    response = StreamingHttpResponse(body, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: do not buffer the stream
    if read.state.binary:
        response["Stream-SSE-Data-Encoding"] = "base64"
    return response


def _body_of(json_mode: bool, chunks: Sequence[StreamChunk]) -> bytes:
    return wire.body_of([c.data for c in chunks], json_mode)


def _sse_data(json_mode: bool, binary: bool, chunks: Sequence[StreamChunk]) -> bytes:
    return wire.sse_data([c.data for c in chunks], json_mode=json_mode, binary=binary)


async def _events(read: store.Read, cursor: str) -> AsyncIterator[bytes]:
    """A data event for each batch with its control event, written together (a reader never
    sees one without the other: the protocol's suite counts on it); a control event first when
    there is nothing to send yet; the last one says the stream is closed, if it is. Ends after
    SSE_SECONDS or SSE_BYTES, after a control event."""
    state = read.state
    json_mode, binary = state.json_mode, state.binary
    position = read.start
    at_end = state.closed and read.up_to_date
    sent = 0
    data = b""
    if read.chunks:
        data = wire.sse_data(read.chunks, json_mode=json_mode, binary=binary)
        sent += len(data)
        position = read.end
    yield data + wire.sse_control(position, cursor_value=cursor, up_to_date=read.up_to_date, closed=at_end)
    if at_end or sent >= SSE_BYTES:
        return
    metrics.sse_clients.inc()
    deadline = time.monotonic() + SSE_SECONDS
    try:
        async with contextlib.aclosing(delivery.afollow(state.id, from_offset=position, idle=KEEPALIVE)) as batches:
            async for progress in batches:
                if not progress.chunks:
                    yield wire.SSE_KEEPALIVE
                    if state.leased:  # the end, if this ended it, comes as the stream's next chunk
                        await leases.aend_if_expired(state.id)
                else:
                    data = delivery.shared(
                        f"ds-sse/{json_mode}/{binary}", progress.chunks, partial(_sse_data, json_mode, binary)
                    )
                    sent += len(data)
                    position = progress.chunks[-1].offset + 1
                    control = wire.sse_control(
                        position, cursor_value=cursor, up_to_date=progress.caught_up, closed=progress.closed
                    )
                    yield data + control
                    if progress.closed:
                        return
                if time.monotonic() >= deadline or sent >= SSE_BYTES:
                    return  # the client resumes from the last control event's offset
        yield wire.sse_control(position, cursor_value=None, up_to_date=True, closed=True)
    except (StreamNotFound, ChunksPruned):
        return  # the client's next request learns why
    finally:
        metrics.sse_clients.dec()
