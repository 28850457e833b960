"""The wire protocol browsers speak (described in docs/reference/), for the WebSocket
consumer and the SSE view alike: offsets in a request, WebSocket close codes, a client's ack, the
shapes of frames and events, and the headers of an answer that carries chunks. Imports neither
Channels nor views; sends nothing."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from typing import Any, Final

from django.utils.html import escape

from .models import Stream
from .types import StreamChunk

# What every HTTP answer that carries a stream's chunks sends, whatever the project's middleware
# does: no MIME sniffing (a writer's text can read as JavaScript), and, opened in a tab, nothing
# runs (a stream's content type, HTML or SVG, is its creator's choice).
UNTRUSTED_CONTENT_HEADERS: Final = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "sandbox; default-src 'none'",
}

_OFFSET = re.compile(r"[0-9]{1,18}\Z")  # a non-negative integer that fits a bigint

# WebSocket close codes: an application's own (4000-4999), numbered as HTTP statuses. daphne lets
# an application close with 1000 or 3000-4999 only: 1011, SERVER_ERROR once, raised instead, and
# the socket stayed open after the error frame.
BAD_REQUEST: Final = 4400
FORBIDDEN: Final = 4403
NOT_FOUND: Final = 4404
TOO_SLOW: Final = 4408
PRUNED: Final = 4410
SERVER_ERROR: Final = 4500

# SSE: how long EventSource waits before it reconnects, and the comment that keeps a quiet
# connection open through proxies.
SSE_RETRY: Final = b"retry: 1000\n\n"
SSE_KEEPALIVE: Final = b": keepalive\n\n"


def parse_offset(values: list[str] | None, name: str) -> int:
    """The single non-negative integer in ``values`` (0 when absent); ValueError otherwise."""
    if not values:
        return 0
    if len(values) > 1:
        raise ValueError(f"give '{name}' once, not {len(values)} times")
    if not _OFFSET.match(values[0]):
        raise ValueError(f"'{name}' must be a non-negative integer offset, not {values[0][:40]!r}")
    return int(values[0])


def client_ack(text: str, max_bytes: int) -> str:
    """The frame id that a client's text frame acknowledges; ValueError, saying what is wrong,
    for any other frame, however malformed or deep (json's RecursionError included)."""
    if len(text) > max_bytes or len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise ValueError(f"client frames are at most {max_bytes} bytes")
    try:
        message = json.loads(text)
    except (ValueError, RecursionError):
        raise ValueError("client frames must be JSON") from None
    if not isinstance(message, dict) or message.get("type") != "ack" or not isinstance(message.get("frame"), str):
        raise ValueError('the only client message is {"type": "ack", "frame": "<frame id>"}')
    return message["frame"]


def past_end(position: int, stream: Stream) -> str:
    return f"offset {position} is past the end of stream {stream.id}, which has {stream.next_offset} chunks"


def chunks_frame(frame: str, stream_id: object, items: str) -> str:
    """A WebSocket ``chunks`` frame: the items (``frame_items`` joined with commas) and the
    frame's id, which the client's ack names."""
    return f'{{"type":"chunks","frame":"{frame}","stream":"{stream_id}","items":[{items}]}}'


def frame_items(chunks: list[StreamChunk], max_items: int, max_bytes: int) -> list[str]:
    """The JSON items of one frame: at least one chunk, else as many as fit the limits, counting
    the items' bytes of UTF-8 and the commas between them."""
    items: list[str] = []
    size = -1  # n items take n - 1 commas
    for chunk in chunks:
        item = f'{{"offset":{chunk.offset},{_data(chunk.data)}}}'
        size += len(item.encode()) + 1
        if items and (len(items) >= max_items or size > max_bytes):
            break
        items.append(item)
    return items


def batch_items(chunks: Sequence[StreamChunk]) -> tuple[str, int]:
    """Every chunk of a batch as a frame's items, joined, and their bytes of UTF-8: what every
    subscriber at this batch sends (``delivery``)."""
    text = ",".join(frame_items(list(chunks), len(chunks), 2**62))
    return text, len(text.encode())


# What ``json.dumps(text, ensure_ascii=False)`` returns for a str, without the encoder object
# dumps() makes for every call with a keyword (the C function its encoder calls).
_json_text: Final = json.encoder.encode_basestring


def _data(data: str | bytes) -> str:
    """A chunk's data as JSON members: its text, or its bytes in base64 with ``"encoding"``."""
    if isinstance(data, bytes):
        return f'"data":"{base64.b64encode(data).decode()}","encoding":"base64"'
    return f'"data":{_json_text(data)}'


def end_frame(next_offset: int) -> dict[str, Any]:
    return {"type": "end", "next_offset": next_offset}


def error_frame(code: int, message: str, **details: Any) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message, **details}


def sse_chunk(chunk: StreamChunk) -> bytes:
    """One chunk as an SSE event: ``id`` its offset, the data as JSON (so newlines survive)."""
    return f'id: {chunk.offset}\ndata: {{"offset":{chunk.offset},{_data(chunk.data)}}}\n\n'.encode()


def html_text(text: str) -> str:
    """Text escaped for HTML, a carriage return as ``&#13;``: SSE would read a raw one as a line
    break, and an HTML parser turns one into a line feed, so the page Django renders and the
    chunks htmx swaps in hold the same characters."""
    return escape(text).replace("\r", "&#13;")


def sse_html_chunk(chunk: StreamChunk) -> bytes:
    """One chunk of a text stream as an SSE event whose data is ``html_text`` of its text, for
    htmx's SSE extension to swap in as it is: ``id`` its offset; a line break a new ``data:``
    line (EventSource joins them with one)."""
    lines = html_text(chunk.data).split("\n")
    data = "".join(f"data: {line}\n" for line in lines)
    return f"id: {chunk.offset}\n{data}\n".encode()


def sse_end(next_offset: int) -> bytes:
    return f"event: end\ndata: {json.dumps({'next_offset': next_offset})}\n\n".encode()


def sse_error(message: str, **details: Any) -> bytes:
    return f"event: error\ndata: {json.dumps({'message': message, **details})}\n\n".encode()
