"""pgstreams: durable, resumable streams for Django, stored in Postgres.

Writers append chunks with ``write()`` (in their transaction) or ``append()`` (committed in
batches across streams, outside it); readers in any process get them in order, exactly once,
with ``read()`` or ``aread()``, and can resume from any offset. Importing this package starts
nothing and touches no model: the API is loaded on first access, so the package can be imported
while Django loads its apps; the flusher and listener threads start on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .exceptions import (
    ChunksPruned,
    ChunkTooLarge,
    InvalidChunk,
    OutcomeUnknown,
    ProducerFenced,
    ProducerGap,
    ReadTimeout,
    StreamClosed,
    StreamError,
    StreamNotFound,
)

# The version of this code: a release's number, or the next one's with ".dev0" between releases
# (CHANGELOG.md says what each changed).
__version__ = "0.2.0.dev0"

if TYPE_CHECKING:
    from .appends import aappend, append, stream_writer
    from .reader import aread, read
    from .types import Producer, StreamChunk
    from .writer import aclose, acreate_stream, awrite, awrite_many, close, create_stream, write, write_many

_LAZY = {
    **dict.fromkeys(["append", "aappend", "stream_writer"], "appends"),
    "StreamChunk": "types",
    "Producer": "types",
    "read": "reader",
    "aread": "reader",
    **dict.fromkeys(
        ["create_stream", "write", "write_many", "close", "acreate_stream", "awrite", "awrite_many", "aclose"],
        "writer",
    ),
}

__all__ = [
    "ChunksPruned",
    "ChunkTooLarge",
    "InvalidChunk",
    "OutcomeUnknown",
    "Producer",
    "ProducerFenced",
    "ProducerGap",
    "ReadTimeout",
    "StreamChunk",
    "StreamClosed",
    "StreamError",
    "StreamNotFound",
    "aappend",
    "aclose",
    "acreate_stream",
    "append",
    "aread",
    "awrite",
    "awrite_many",
    "close",
    "create_stream",
    "read",
    "stream_writer",
    "write",
    "write_many",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pgstreams' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
