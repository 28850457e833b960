"""Exceptions: ``StreamError`` and its subclasses, the only errors pgstreams raises of its own."""

from __future__ import annotations


class StreamError(Exception):
    """Base class of every pgstreams error."""


class StreamNotFound(StreamError, LookupError):
    """No stream has this id (it was never created, or it was deleted)."""


class StreamClosed(StreamError):
    """The stream was closed: it takes no more writes, and it cannot be closed again."""


class ChunkTooLarge(StreamError, ValueError):
    """A chunk is larger than ``PGSTREAMS['MAX_CHUNK_BYTES']`` in UTF-8."""


class InvalidChunk(StreamError, ValueError):
    """A chunk holds text that Postgres cannot store (a NUL character)."""


class ProducerFenced(StreamError):
    """An idempotent producer wrote with an older epoch than the stream has seen from its id:
    another instance of it has taken over. ``epoch`` is the current one."""

    def __init__(self, producer_id: str, epoch: int, current: int) -> None:
        super().__init__(
            f"producer {producer_id!r} wrote with epoch {epoch}, but the stream has epoch {current} from it: "
            "another instance took over; start a new epoch only if this one should win"
        )
        self.epoch = current


class ProducerGap(StreamError):
    """An idempotent producer skipped sequence numbers: ``expected`` is the one the stream waits
    for (a batch before this one was never written; send it first)."""

    def __init__(self, producer_id: str, seq: int, expected: int) -> None:
        super().__init__(f"producer {producer_id!r} sent seq {seq}, but the stream expects seq {expected} next")
        self.expected = expected


class OutcomeUnknown(StreamError):
    """An append's commit got no answer, and the database could not be asked in time whether it
    committed: the chunk may or may not be in the stream."""


class ReadTimeout(StreamError, TimeoutError):
    """A reader waited longer than its ``timeout`` for the next chunk."""


class ChunksPruned(StreamError, LookupError):
    """The chunks a reader asked for were deleted (pruned) from the stream.

    Attributes:
        stream_id: the stream.
        offset: the offset the reader asked for.
        first_offset: where reading can resume: the first chunk still held after ``offset``, or
            the stream's end when none is.
    """

    def __init__(self, stream_id: object, offset: int, first_offset: int) -> None:
        super().__init__(
            f"stream {stream_id} no longer holds chunks {offset} to {first_offset - 1} (they were pruned); "
            f"reading can resume at offset {first_offset}"
        )
        self.stream_id = stream_id
        self.offset = offset
        self.first_offset = first_offset
