"""The Durable Streams POST (append, append and close, close) on the append path: the request's
stream is found by its path and its authorization asked (``store.find``, on a reading thread,
taking no lock), its body cut into the stream's chunks, then the append is handed to the
appender as a ``DurableAppend`` and committed with the other appends in flight in the process,
across requests and streams, in one transaction per batch. The request waits for its batch on
the event loop, holding no thread.

Where a path leads is remembered per process (``PATHS`` of them, for ``PATH_SECONDS`` each, the
least used forgotten first; a plain create remembers the stream it made), so that an append costs
no lookup: the batch checks that the stream it locks is still the one found there (not deleted,
expired, or given another owner, a check made of a fresh lookup too, whose rule was asked before
the row was locked); if it is not, nothing is written and the request is done again from a fresh
lookup. A stream's id, path and content type never change, so no entry can lead a
chunk to another stream. The rule (``DURABLE_AUTHORIZE``) is asked at every request, about the
stream as it was remembered; an ``async def`` rule, on the event loop, so that an append to a
remembered stream with a small body holds no thread (the rule's own queries, if any, take theirs).

Inside the batch each append is judged on its own, in the order the protocol checks a POST: the
producer's epoch and seq, the stream's closure, the content type, ``Stream-Seq``, the body; a
refusal answers only its own request, with the protocol's status and headers, and the producer's
state commits in the transaction of the chunk it guards. A stream whose row another transaction
holds is not waited on in the batch: its appends wait for a later one, and answer 503 after
QUERY_TIMEOUT. No HTTP here beyond the statuses and headers of ``wire.Refused``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

import psycopg
from asgiref.sync import iscoroutinefunction

from .. import appender, batch, conf, producers, threads
from ..exceptions import OutcomeUnknown, ProducerFenced, ProducerGap, StreamError
from ..models import Stream, media_type
from ..process import PerProcess
from ..types import Producer
from . import store, wire
from .wire import Refused

# Paths whose streams a process remembers, for at most PATH_SECONDS each (the authorization rule
# is shown the stream as it was then).
PATHS: Final = 4096
PATH_SECONDS: Final = 10.0
# A body the event loop cuts into chunks itself (a JSON array of 4 KiB: about 0.2 ms); a larger
# one is cut on a thread.
LOOP_BODY_BYTES: Final = 4096


class Stale(batch.NotJudged):
    """The stream remembered at a path is no longer the one there: look again."""


_find = threads.durable.wrap(store.find)


@dataclass(slots=True, eq=False)
class DurableAppend(batch.Item):
    """One POST, as the appender's item; its result is a ``store.Appended``."""

    path: str = ""
    content_type: str | None = None  # the request's; None without a body
    chunks: list[str | bytes] | Refused | None = None  # the body as the stream's chunks, or why not
    closing: bool = False
    writer_seq: str | None = None
    remembered: bool = False  # its stream was found in the paths remembered
    owner_id: Any = None  # the stream's owner when it was found

    @property
    def size(self) -> int:
        return len(self.chunks) if isinstance(self.chunks, list) else 1

    @property
    def data_size(self) -> int:
        return sum(map(len, self.chunks)) if isinstance(self.chunks, list) else 0

    def judge(self, row: batch.Row | None, producer_state: tuple[int, int] | None) -> batch.Accepted | BaseException:
        if self.remembered and (row is None or row.gone):
            return Stale()  # the stream remembered at the path is no longer there
        if row is not None and row.owner_id != self.owner_id:
            return Stale()  # given another owner since it was found, remembered or not: ask again
        if row is None or row.gone:
            return Refused(404, f"no stream at {self.path!r}")
        if self.producer is not None:
            try:
                duplicate = producers.judge(producer_state, self.producer)
            except ProducerFenced as exc:
                return Refused(403, str(exc), {"Producer-Epoch": str(exc.epoch)})
            except ProducerGap as exc:
                if row.closed:
                    return _closed(self.path, row)
                headers = {"Producer-Expected-Seq": str(exc.expected), "Producer-Received-Seq": str(self.producer.seq)}
                return Refused(409, str(exc), headers)
            except ValueError as exc:
                return Refused(400, str(exc))
            if duplicate is not None:
                return batch.Accepted([], duplicate=duplicate)
        if row.closed:
            if self.closing and self.chunks is None:
                return batch.Accepted([])  # closed already: closing again says so
            return _closed(self.path, row)
        if self.chunks is not None and media_type(self.content_type or "") != media_type(row.content_type):
            return Refused(409, f"the stream's content type is {row.content_type}, not {self.content_type}")
        if self.writer_seq is not None and row.writer_seq and self.writer_seq <= row.writer_seq:
            last = row.writer_seq[:80]
            return Refused(409, f"Stream-Seq {self.writer_seq[:80]!r} is not after the last one, {last!r}")
        if isinstance(self.chunks, Refused):
            return self.chunks
        return batch.Accepted(
            self.chunks or [], closing=self.closing, writer_seq=self.writer_seq, producer=self.producer
        )

    def result(self, row: batch.Row, first: int | None, accepted: batch.Accepted) -> store.Appended:
        state = store.State(row.id, row.content_type, accepted.next_offset, accepted.closed, row.ttl, row.expires_at)
        if accepted.duplicate is not None:
            return store.Appended(state, 204, accepted.duplicate)
        if self.producer is None or accepted.producer is None:
            return store.Appended(state, 204)
        return store.Appended(state, 200 if self.chunks else 204, (self.producer.epoch, self.producer.seq))

    def held(self) -> BaseException:
        return store.Busy(self.path)


def _closed(path: str, row: batch.Row) -> Refused:
    headers = {"Stream-Closed": "true", "Stream-Next-Offset": wire.format_offset(row.next_offset)}
    return Refused(409, f"the stream at {path!r} is closed", headers)


async def post(
    request: Any,
    path: str,
    body: bytes,
    *,
    content_type: str | None,
    closing: bool,
    producer: Producer | None,
    writer_seq: str | None,
) -> store.Appended:
    """A POST's append (or close, or both), committed with the other appends in flight; raises
    the ``Refused`` that answers it."""
    loop = asyncio.get_running_loop()
    known = _remembered(path)
    while True:  # again from a fresh lookup only when the stream changed since it was found
        stream, chunks = await _found(request, path, body, closing=closing, known=known)
        if stream is not known:
            remember(path, stream)
        item = DurableAppend(
            stream.id,
            loop.create_future(),
            loop,
            producer=producer,
            path=path,
            content_type=content_type,
            chunks=chunks,
            closing=closing,
            writer_seq=writer_seq,
            remembered=stream is known,
            owner_id=stream.owner_id,
        )
        try:
            return await _commit(item)
        except Stale:
            _forget(path)
            known = None


async def _found(
    request: Any, path: str, body: bytes, *, closing: bool, known: Stream | None
) -> tuple[Stream, list[str | bytes] | Refused | None]:
    """``store.find()``, on the event loop when it needs no query: the stream is remembered, the
    rule is ``async def`` and allows the request, and the body is at most LOOP_BODY_BYTES. A
    thread's hop costs more than the rest of such an append's Python (about 150 us of CPU)."""
    rule = conf.durable_authorize()
    if known is None or len(body) > LOOP_BODY_BYTES or not iscoroutinefunction(rule):
        return await _find(request, path, body, closing=closing, known=known)
    if not await store.aallowed(rule, request, store.post_action(body, closing=closing), path, known):
        return await _find(request, path, body, closing=closing)  # asked again of the stream read afresh
    if closing and body and not await store.aallowed(rule, request, "close", path, known):
        raise store.refusal("close", path)
    return known, store.post_chunks(known, body)


async def _commit(item: DurableAppend) -> store.Appended:
    try:
        result: store.Appended = await appender.appender(conf.database()).asubmit(item)
    except OutcomeUnknown as exc:
        raise Refused(503, f"{exc}; the append may have been stored: retry it as an idempotent producer") from None
    except StreamError as exc:
        if isinstance(exc.__cause__, psycopg.DataError | psycopg.IntegrityError):  # refused by the database
            raise Refused(400, str(exc)) from None
        # not committed: the database was unreachable for the retry budget
        raise Refused(503, f"{exc}; try again", {"Retry-After": "1"}) from None
    return result


class _Paths:
    """The streams last found at paths, and when, at most PATHS of them."""

    def __init__(self) -> None:
        self.streams: OrderedDict[str, tuple[Stream, float]] = OrderedDict()
        self.lock = threading.Lock()


_paths: PerProcess[_Paths] = PerProcess(_Paths, lambda _: None)


def _remembered(path: str) -> Stream | None:
    paths = _paths.get()
    with paths.lock:
        found = paths.streams.get(path)
        if found is None or time.monotonic() - found[1] > PATH_SECONDS:
            return None
        paths.streams.move_to_end(path)
        return found[0]


def remember(path: str, stream: Stream) -> None:
    """Remember ``stream`` at ``path``, as it is now (``creates`` remembers the streams it makes,
    so that their first append needs no lookup)."""
    paths = _paths.get()
    with paths.lock:
        paths.streams[path] = (stream, time.monotonic())
        paths.streams.move_to_end(path)
        while len(paths.streams) > PATHS:
            paths.streams.popitem(last=False)


def _forget(path: str) -> None:
    paths = _paths.get()
    with paths.lock:
        paths.streams.pop(path, None)
