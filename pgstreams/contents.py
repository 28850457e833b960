"""What a stream's content type lets the Python writers (``write``, ``write_many``, the append
path) store in it, and the per-process memory of it.

A ``text/*`` stream takes any text; an ``application/json`` stream one JSON value per chunk (a
Durable Streams reader gets each chunk as one message); a stream of any other type holds bytes,
which only the Durable Streams endpoint writes. A stream's content type never changes, so each
process asks the database about a stream once (``Kinds``). Also what no text or JSON column can
store (``unstorable``). Reads nothing else and writes nothing.
"""

from __future__ import annotations

import functools
import json
import math
import threading
import uuid
from collections.abc import Iterable
from typing import Any, Final, Literal

from .exceptions import InvalidChunk
from .models import is_text, media_type

Kind = Literal["text", "json", "bytes"]

# Streams whose kind a process remembers, at most (it forgets the oldest half beyond).
REMEMBERED: Final = 100_000


@functools.lru_cache(maxsize=256)
def kind_of(content_type: str) -> Kind:
    """The kind of a content type; remembered, as the append path asks it of every item (a
    project's streams have a few types, and parsing one each time cost 7% of a writer's CPU)."""
    if media_type(content_type) == "application/json":
        return "json"
    return "text" if is_text(content_type) else "bytes"


def _not_json(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        raise ValueError(f"{text[:40]} is too large for a JSON reader's numbers")
    return number


# JSON as every reader can take it: no NaN, no Infinity, no number past a double's range. The
# Durable Streams endpoint parses bodies with it too.
STRICT_JSON: Final = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite)


def _one_value(data: str) -> None:
    """Parse ``data`` as one JSON value with STRICT_JSON, raising as its ``decode()`` does. Its
    scanner first, alone (a third of the cost, for a chunk per token): a value it reads to the
    end, from the first character, is what ``decode()`` would read; anything else (surrounding
    whitespace, an error) goes to ``decode()``, which says what is wrong."""
    try:
        if STRICT_JSON.scan_once(data, 0)[1] == len(data):
            return
    except StopIteration:
        pass
    STRICT_JSON.decode(data)


def check_fits(kind: Kind, data: str, stream_id: uuid.UUID) -> None:
    """Raise InvalidChunk if a stream of ``kind`` cannot hold the text chunk ``data``."""
    if kind == "text":
        return
    if kind == "bytes":
        raise InvalidChunk(
            f"stream {stream_id} holds bytes (its content type is not text/* or application/json); "
            "Python writers write text: write to a text or JSON stream, or append the bytes over "
            "the Durable Streams endpoint"
        )
    try:
        _one_value(data)
    except (ValueError, RecursionError) as exc:
        raise InvalidChunk(
            f"stream {stream_id} is application/json and a chunk is one JSON value, which {data[:40]!r} is not "
            f"({exc}); write each value as its own chunk (json.dumps it)"
        ) from None


def unstorable(value: Any) -> str | None:
    """What in ``value`` (text, or JSON made of dicts, lists and scalars) Postgres cannot store,
    if anything: "a NUL character" (no text or jsonb holds one) or "a lone surrogate" (no UTF-8
    does)."""
    pending = [value]
    while pending:  # bounded by the value's size
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item)
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
        elif isinstance(item, str):
            if "\x00" in item:
                return "a NUL character"
            if not item.isascii():
                try:
                    item.encode()
                except UnicodeEncodeError:
                    return "a lone surrogate"
    return None


class Kinds:
    """The kinds of the streams this process has written, by id."""

    def __init__(self) -> None:
        self._known: dict[uuid.UUID, Kind] = {}
        self._lock = threading.Lock()

    def get(self, stream_id: uuid.UUID) -> Kind | None:
        return self._known.get(stream_id)

    def remember(self, rows: Iterable[tuple[uuid.UUID, str]]) -> None:
        """Note ``(id, content_type)`` pairs."""
        with self._lock:
            if len(self._known) >= REMEMBERED:
                for stream_id in list(self._known)[: REMEMBERED // 2]:
                    del self._known[stream_id]
            for stream_id, content_type in rows:
                self._known[stream_id] = kind_of(content_type)


kinds = Kinds()
LOOKUP_SQL = "SELECT id, content_type FROM pgstreams_stream WHERE id = ANY(%s)"
