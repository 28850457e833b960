"""The Durable Streams protocol's vocabulary, pure: offsets, the request headers and bodies a
server must check, cursors, ETags and SSE events. No database, no Django request or response.

A refused request raises ``Refused`` with the status the protocol gives and a message that says
what to send instead; the views turn it into the response.
"""

from __future__ import annotations

import base64
import datetime
import json
import random
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any, Final

from django.utils.crypto import salted_hmac

from ..contents import STRICT_JSON
from ..models import path_problem
from ..types import Producer

# An offset is the chunk offset it stands for, then a part this server always sets to zero: the
# shape the protocol's clients and suite use, fixed-width so that text order is offset order.
_OFFSET = re.compile(r"([0-9]{16})_0{16}\Z")
_OFFSET_LIMIT: Final = 10**16
START: Final = "-1"
NOW: Final = "now"

# Stream-TTL, Producer-Epoch and Producer-Seq: decimal, no sign, no leading zero, at most 19 digits.
_WHOLE = re.compile(r"(0|[1-9][0-9]{0,18})\Z")
# RFC 3339 date-time, as Stream-Expires-At must be.
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})\Z"
)
# A Content-Type: a type/subtype and parameters, in printable ASCII, that the table can hold.
_CONTENT_TYPE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+/[!#$%&'*+.^_`|~0-9A-Za-z-]+( *;[ -~]*)?\Z")
JS_SAFE: Final = 2**53 - 1

# ASCII digits: a Content-Length; a cursor this server gave (at most 19 of them).
_DIGITS = re.compile(r"[0-9]+\Z")
_CURSOR = re.compile(r"[0-9]{1,19}\Z")
# Cursors count 20-second intervals from 2024-10-09 00:00 UTC (the protocol's defaults).
_CURSOR_EPOCH: Final = datetime.datetime(2024, 10, 9, tzinfo=datetime.UTC).timestamp()
_CURSOR_INTERVAL: Final = 20

_random = random.Random()  # its own: the global state a project may seed is left alone
DEFAULT_CONTENT_TYPE: Final = "application/octet-stream"


class Refused(Exception):
    """A request the protocol refuses: the status, what to do instead, and headers to add."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def format_offset(offset: int) -> str:
    """The protocol offset of chunk offset ``offset`` (where the next read starts)."""
    if not 0 <= offset < _OFFSET_LIMIT:
        raise ValueError(f"offset {offset} does not fit the protocol's 16 digits")
    return f"{offset:016d}_{0:016d}"


def parse_offset(text: str, what: str = "offset") -> int:
    """The chunk offset a protocol offset this server gave stands for; 400 for anything else."""
    match = _OFFSET.match(text)
    if match is None:
        raise Refused(400, f"{what} {text[:80]!r} is not an offset this server gave (-1, now or a Stream-Next-Offset)")
    return int(match.group(1))


def read_offset(values: list[str]) -> str:
    """The ``offset`` query parameter: -1 when absent, once at most, never empty."""
    if not values:
        return START
    if len(values) > 1:
        raise Refused(400, f"give offset once, not {len(values)} times")
    if not values[0]:
        raise Refused(400, "offset is empty: give -1, now or a Stream-Next-Offset")
    return values[0]


def stream_path(name: str) -> str:
    """A stream's path from its URL, checked (``models.path_problem``), and text that UTF-8 can
    hold (no lone surrogate, which an ASGI application may be handed but the database refuses)."""
    if not name.isascii():
        try:
            name.encode()
        except UnicodeEncodeError:
            raise Refused(
                400, "a stream path must be text without lone surrogates; percent-encode it as UTF-8"
            ) from None
    problem = path_problem(name)
    if problem is not None:
        raise Refused(404 if name.startswith("__ds/") else 400, problem)
    return name


def whole(text: str, header: str, limit: int = JS_SAFE) -> int:
    """A header's non-negative decimal integer, at most ``limit``; 400 otherwise."""
    if not _WHOLE.match(text) or int(text) > limit:
        raise Refused(400, f"{header} must be a whole number from 0 to {limit} without sign or leading zeros")
    return int(text)


def flag(value: str | None) -> bool:
    """Stream-Closed: present only when exactly ``true``, in any case."""
    return value is not None and value.strip().lower() == "true"


def expiry(ttl: str | None, expires_at: str | None) -> tuple[int | None, datetime.datetime | None]:
    """Stream-TTL and Stream-Expires-At, of which a request gives at most one."""
    if ttl is not None and expires_at is not None:
        raise Refused(400, "give Stream-TTL or Stream-Expires-At, not both")
    if ttl is not None:
        return whole(ttl, "Stream-TTL", 2**31 - 1), None
    if expires_at is not None:
        moment = None
        if _RFC3339.match(expires_at.strip()):
            try:
                moment = datetime.datetime.fromisoformat(expires_at.strip().upper()).astimezone(datetime.UTC)
            except (ValueError, OverflowError):
                moment = None
        if moment is None or not 1970 <= moment.year <= 9999:
            raise Refused(400, f"Stream-Expires-At {expires_at[:60]!r} is not an RFC 3339 time from 1970 to 9999")
        return None, moment
    return None, None


def content_type(value: str | None) -> str | None:
    """A request's Content-Type, if it gave one: a media type of at most 255 characters."""
    if value is None or not value.strip():
        return None
    if len(value) > 255 or not _CONTENT_TYPE.match(value.strip()):
        raise Refused(400, f"Content-Type {value[:80]!r} is not a media type of at most 255 characters")
    return value.strip()


def producer(headers: Any) -> Producer | None:
    """Producer-Id, Producer-Epoch and Producer-Seq: all three or none."""
    given = [headers.get(name) for name in ("Producer-Id", "Producer-Epoch", "Producer-Seq")]
    if all(value is None for value in given):
        return None
    if any(value is None for value in given):
        raise Refused(400, "give Producer-Id, Producer-Epoch and Producer-Seq together, or none of them")
    producer_id, epoch, seq = given
    if not producer_id.strip():
        raise Refused(400, "Producer-Id must not be empty")
    return Producer(producer_id, whole(epoch, "Producer-Epoch"), whole(seq, "Producer-Seq"))


def json_messages(body: bytes, most: int) -> list[str]:
    """The JSON messages of a body: its value, or the items of a top-level array (one level
    flattened), each kept as the text the client sent; 413 for an array of more than ``most``
    items, before they are cut out."""
    try:
        text = body.decode()
        value = STRICT_JSON.decode(text)
    except (ValueError, RecursionError) as exc:
        raise Refused(400, f"the body is not valid JSON: {exc}") from None
    if not isinstance(value, list):
        return [text.strip(" \t\n\r")]
    if len(value) > most:
        raise Refused(
            413,
            f"a JSON array of {len(value)} values is over one append's {most} (PGSTREAMS['APPEND_BATCH']); "
            "send them in several appends",
        )
    items = []
    position = _SPACE.match(text).end() + 1  # past the array's "["
    for _ in value:
        start = _SPACE.match(text, position).end()
        position = STRICT_JSON.raw_decode(text, start)[1]
        items.append(text[start:position])
        position = _SPACE.match(text, position).end() + 1  # past the "," (or the final "]")
    return items


_SPACE = re.compile(r"[ \t\n\r]*")


def text_body(body: bytes) -> str:
    """The body of an append to a text stream: UTF-8, without NUL (which PostgreSQL text cannot hold)."""
    try:
        text = body.decode()
    except UnicodeDecodeError as exc:
        raise Refused(
            400, f"the body is not UTF-8 text ({exc.reason} at byte {exc.start}); text streams hold text"
        ) from None
    if "\x00" in text:
        raise Refused(400, "the body holds a NUL character, which a text stream cannot store; use a binary type")
    return text


def pieces(data: str | bytes, limit: int) -> Iterator[str | bytes]:
    """``data`` cut into chunks of at most ``limit`` bytes (text at character boundaries)."""
    if isinstance(data, bytes):
        for start in range(0, len(data), limit):
            yield data[start : start + limit]
        return
    encoded = data.encode()
    start = 0
    while start < len(encoded):
        end = min(start + limit, len(encoded))
        while end < len(encoded) and (encoded[end] & 0xC0) == 0x80:  # inside a character
            end -= 1
        if end == start:  # a limit smaller than one character: that character alone
            end = start + 1
            while end < len(encoded) and (encoded[end] & 0xC0) == 0x80:
                end += 1
        yield encoded[start:end].decode()
        start = end


def cursor(given: str | None) -> str:
    """A live response's Stream-Cursor: the current interval, and always past the client's."""
    now = int((time.time() - _CURSOR_EPOCH) // _CURSOR_INTERVAL)
    if given is not None and _CURSOR.match(given) and int(given) >= now:
        return str(int(given) + 1 + _random.randrange(3600) // _CURSOR_INTERVAL)
    return str(now)  # a cursor this server did not give keys nothing here (as the reference server)


def digits(text: str) -> bool:
    """Whether ``text`` is ASCII digits only (``str.isdigit`` takes ``²``, which ``int`` refuses)."""
    return _DIGITS.match(text) is not None


def etag(stream_id: uuid.UUID, start: int, end: int, closed: bool) -> str:
    """A read's ETag: the stream (by a keyed hash of its id, which tells nothing about the id:
    the id of an ownerless stream is a read capability at the other endpoints), the range, and
    whether it ends the stream."""
    stream = salted_hmac("pgstreams.durable.etag", stream_id.bytes, algorithm="sha256").hexdigest()[:20]
    return f'"{stream}:{start}:{end}{":c" if closed else ""}"'


def etag_matches(tag: str, if_none_match: str | None) -> bool:
    if not if_none_match:
        return False
    offered = {item.strip().removeprefix("W/") for item in if_none_match.split(",")}
    return tag in offered or "*" in offered


def body_of(chunks: Iterable[str | bytes], json_mode: bool) -> bytes:
    """A read's body: JSON streams' messages as one array, others their chunks end to end."""
    if json_mode:
        return ("[" + ",".join(_as_text(c) for c in chunks) + "]").encode()
    return b"".join(c if isinstance(c, bytes) else c.encode() for c in chunks)


def _as_text(chunk: str | bytes) -> str:
    return chunk.decode() if isinstance(chunk, bytes) else chunk


_LINES = re.compile(rb"\r\n|\r|\n")


def sse_data(chunks: list[str | bytes], *, json_mode: bool, binary: bool) -> bytes:
    """One ``data`` event: base64 for binary streams; otherwise the text, a ``data:`` line per
    line (so that no payload can end the event or start another), its spaces kept. Made in
    bytes, joined once: a megabyte of chunks costs two copies of it, not five."""
    payload = body_of(chunks, json_mode)
    if binary:
        return b"".join((b"event: data\ndata:", base64.b64encode(payload), b"\n\n"))
    # In UTF-8 a line break is its ASCII byte, never a part of another character.
    parts = [b"event: data\n"]
    for line in _LINES.split(payload):
        # A reader drops one space after "data:": a line that starts with one gets one more to drop.
        parts += (b"data: " if line[:1] == b" " else b"data:", line, b"\n")
    parts.append(b"\n")
    return b"".join(parts)


def sse_control(next_offset: int, *, cursor_value: str | None, up_to_date: bool, closed: bool) -> bytes:
    """A ``control`` event: where to resume; the cursor while the stream is open; whether the
    reader is caught up, or at the end of a closed stream."""
    control: dict[str, Any] = {"streamNextOffset": format_offset(next_offset)}
    if closed:
        control["streamClosed"] = True
    else:
        control["streamCursor"] = cursor_value
    if up_to_date or closed:
        control["upToDate"] = True
    return f"event: control\ndata:{json.dumps(control, separators=(',', ':'))}\n\n".encode()


SSE_KEEPALIVE: Final = b": keepalive\n\n"
