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


class ReadTimeout(StreamError, TimeoutError):
    """A reader waited longer than its ``timeout`` for the next chunk."""
