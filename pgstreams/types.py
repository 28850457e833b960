"""The vocabulary both sides of pgstreams share: stream ids, chunks as readers get them, an
idempotent producer's batch, what a notification says of a stream, and the range of offsets. No
behaviour beyond converting an id."""

from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from .exceptions import StreamNotFound

# Offsets are bigint: the highest one a stream can have.
MAX_OFFSET: Final = 2**63 - 1


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """One chunk as readers receive it: ``data`` is text, or bytes in a stream of a binary content
    type (see ``Stream.holds_text``)."""

    stream_id: uuid.UUID
    offset: int
    data: str | bytes
    created_at: datetime.datetime


class Producer(NamedTuple):
    """An idempotent producer's batch: its stable ``id``, the ``epoch`` it writes in (raised when
    it restarts) and the batch's ``seq`` (0, 1, 2... within an epoch). A write with the same three
    again is recognised and not stored twice."""

    id: str
    epoch: int
    seq: int


class Mark(NamedTuple):
    """What a notification says about one stream: it has chunks below ``next_offset``."""

    stream_id: uuid.UUID
    next_offset: int
    closed: bool


def stream_uuid(stream_id: Any) -> uuid.UUID:
    """``stream_id`` (a UUID, its text, or a Stream) as a UUID; a value that cannot be one names
    no stream."""
    if isinstance(stream_id, uuid.UUID):
        return stream_id
    from .models import Stream  # not at import: this module loads before the app registry

    if isinstance(stream_id, Stream):
        return stream_id.id
    try:
        return uuid.UUID(str(stream_id))
    except ValueError:
        raise StreamNotFound(f"{stream_id!r} is not a stream id (stream ids are UUIDs)") from None
