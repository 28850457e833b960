"""What the endpoints send of a stream's chunks, made once per process: the subscribers of one
stream in one process that are at the same place (a live stream's followers all are) get the
same encoded bytes, made by the first of them to ask and kept for the others; and the delivery
metrics are counted once per batch, not once per subscriber.

An encoding is keyed by its kind (a WebSocket frame's items, an SSE event run, a Durable Streams
body), the stream and the batch's first and last offsets: a chunk never changes once committed,
so an entry is right for as long as it is kept. At most ``ENTRIES`` are kept, the oldest go
first. What is per subscriber stays with each endpoint: its window and flow control, frame ids
and acks, its position. No SQL, no socket and no thread of its own.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from . import metrics
from .types import StreamChunk

T = TypeVar("T")

# Encodings kept: a few rounds' worth for every stream a process follows.
ENTRIES: Final = 8192

Key = tuple[str, uuid.UUID, int, int]


class Encoded:
    """One batch's encoding and whether its delivery was counted."""

    __slots__ = ("value", "counted")

    def __init__(self, value: Any) -> None:
        self.value = value
        self.counted = False


class Encodings:
    """The process's shared encodings (see the module docstring)."""

    def __init__(self) -> None:
        self._entries: OrderedDict[Key, Encoded] = OrderedDict()
        self._lock = threading.Lock()
        self.made = 0  # encodings made, and
        self.shared = 0  # encodings served to a second subscriber or more

    def get(self, kind: str, chunks: Sequence[StreamChunk], make: Callable[[Sequence[StreamChunk]], T]) -> T:
        """``make(chunks)``, made once for every subscriber that sends the same batch as ``kind``;
        the first to send it counts its delivery (``metrics.observe_delivery``)."""
        key = (kind, chunks[0].stream_id, chunks[0].offset, chunks[-1].offset)
        entry = self._entries.get(key)
        if entry is not None:
            self.shared += 1
        else:
            entry = Encoded(make(chunks))
            with self._lock:
                entry = self._entries.setdefault(key, entry)
                if len(self._entries) > ENTRIES:
                    self._entries.popitem(last=False)
            self.made += 1
        if not entry.counted:
            entry.counted = True
            metrics.observe_delivery(chunks)
        return entry.value


encodings = Encodings()
shared = encodings.get
