"""What browsers send and get, shared by the WebSocket consumer and the SSE view: offsets in a
request, and the error for an offset past a stream's end. Imports neither Channels nor views."""

from __future__ import annotations

import re

from .models import Stream

_OFFSET = re.compile(r"[0-9]{1,18}\Z")  # a non-negative integer that fits a bigint


def parse_offset(values: list[str] | None, name: str) -> int:
    """The single non-negative integer in ``values`` (0 when absent); ValueError otherwise."""
    if not values:
        return 0
    if len(values) > 1:
        raise ValueError(f"give '{name}' once, not {len(values)} times")
    if not _OFFSET.match(values[0]):
        raise ValueError(f"'{name}' must be a non-negative integer offset, not {values[0][:40]!r}")
    return int(values[0])


def past_end(position: int, stream: Stream) -> str:
    return f"offset {position} is past the end of stream {stream.id}, which has {stream.next_offset} chunks"
