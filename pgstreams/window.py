"""What the listener keeps of one followed stream (``Tail``) and what one fetch found (``Page``):
the window arithmetic, pure, with no database, lock or thread of its own (the listener holds the
lock around every call).

A tail keeps a window of the chunks fetched last (consecutive offsets ``start`` to ``end - 1``),
within a memory budget (``WINDOW_BYTES``), the highest offset announced, and the stream's end
once it is known. Readers take chunks from the window; a reader behind it asks for its own page,
and a reader ahead of it moves it to itself (``jump``): the window follows the readers at the
front, and is never fetched through chunks that no reader waits for.
"""

from __future__ import annotations

import asyncio
import datetime
import sys
import threading
import uuid
from dataclasses import dataclass, field
from itertools import repeat
from typing import Final, Protocol

from .exceptions import StreamError
from .types import StreamChunk

# What a chunk in a window costs beyond its data's str: its timestamp and two lists' slots (by
# sys.getsizeof).
CHUNK_OVERHEAD: Final = 64
# Chunks handed to a reader at once.
BATCH: Final = 256


class Push(Protocol):
    """A reader that does not wait for its tail but is called back, in its loop, once the tail
    moves (delivery's fans): a thousand streams' waits between rounds are no tasks, coroutines
    or futures."""

    loop: asyncio.AbstractEventLoop

    def set(self) -> None: ...


Event = threading.Event | asyncio.Event  # what readers wait on: a thread's, or a loop's
Waiter = Event | Push  # what a change of the tail wakes


@dataclass(slots=True)
class Page:
    """What one fetch found for (stream, from_offset): the stream's state and its chunks from
    from_offset on, consecutive (a page stops before a gap), kept as their values and their
    times (see ``Tail``) until a reader takes them (``chunks``)."""

    exists: bool
    next_offset: int = 0
    closed: bool = False
    values: list[str | bytes] = field(default_factory=list)
    times: list[datetime.datetime] = field(default_factory=list)
    data: int = 0  # the chunks' characters of text, bytes of binary
    # Set when the chunk at from_offset is gone though the stream is past it (pruned): where
    # reading can resume, the next chunk still held or next_offset.
    pruned_to: int | None = None

    def chunks(self, stream_id: uuid.UUID, from_offset: int) -> list[StreamChunk]:
        """The page's chunks, as readers get them (the page of ``(stream_id, from_offset)``)."""
        return _chunks(stream_id, from_offset, self.values, self.times)


@dataclass(slots=True, eq=False)
class Tail:
    """What this process knows of one followed stream.

    The window keeps its chunks' values and times, in two lists, not their ``StreamChunk``: a
    chunk stays in a window for seconds, long enough for the collector to move what it tracks to
    its oldest generation, whose full passes stop the process for as long as they take (the
    strings and the datetimes it does not track). A reader's chunks are made when it takes them.
    """

    stream_id: uuid.UUID
    channel: str = ""  # its notification channel (one per shard, NOTIFY_SHARDS)
    born: int = 0  # the listener's fetch round when it was made: pages of that round or before predate it
    readers: int = 0
    # window holds chunks start .. end-1; start is None until the first fetch.
    start: int | None = None
    end: int = 0
    values: list[str | bytes] = field(default_factory=list)  # the window's chunks' data, from start
    times: list[datetime.datetime] = field(default_factory=list)  # and their created_at
    window_bytes: int = 0  # what the window's chunks cost, by size()
    hint: int = 0  # highest next_offset announced or seen
    shown: int = 0  # highest next_offset a fetched page showed: chunks below it can be fetched
    close_hinted: bool = False
    heard: int = 0  # announcements made to it: counted, to tell whether one came since a fetch was asked for
    asked: int = 0  # heard, when its last fetch was asked for
    final: int | None = None  # next_offset once the stream is known to be closed
    gone: bool = False  # the stream was deleted
    failure: StreamError | None = None  # the database refused to fetch this tail
    dirty: bool = False
    polled: bool = False
    # What waits for the tail to move: an event per loop (None: the threads'), which its readers
    # there share, and the readers called back instead (``Push``), in the order they came.
    waiters: dict[asyncio.AbstractEventLoop | None, Event] = field(default_factory=dict)
    pushes: dict[Push, None] = field(default_factory=dict)

    def waiting(self) -> bool:
        return bool(self.waiters or self.pushes)

    def woken(self) -> list[tuple[asyncio.AbstractEventLoop | None, Waiter]]:
        """Its waiters and pushes, each with the loop to wake it in, taken off it: each one steps
        again, and waits again if it has to."""
        woken = list(self.waiters.items())  # runs for every tail a round moves: no generator for no push
        self.waiters.clear()
        if self.pushes:
            woken += [(push.loop, push) for push in self.pushes]
            self.pushes.clear()
        return woken

    def wants_fetch(self) -> bool:
        return self.hint > self.end or (self.close_hinted and self.final is None)

    def batch(self, i: int, most: int) -> list[StreamChunk]:
        """The window's chunks from its ``i``-th: at most BATCH, ending with the one whose data
        reaches ``most`` (one at least). The window is about a page unless WINDOW_BYTES is
        larger: only then are the chunks' sizes summed."""
        values = self.values[i : i + BATCH]
        if self.window_bytes > most:
            data = 0
            for n, value in enumerate(values, 1):
                data += len(value)
                if data >= most:
                    del values[n:]
                    break
        assert self.start is not None
        return _chunks(self.stream_id, self.start + i, values, self.times[i : i + len(values)])

    def settle(self, next_offset: int, closed: bool) -> None:
        """What the primary said of the stream, with no announcement since it was asked: an
        announcement of more (anyone who may connect can NOTIFY on the channel) is forgotten,
        so it costs one fetch, not one per round."""
        self.hint = next_offset
        self.close_hinted = closed

    def merge(self, from_offset: int, page: Page, budget: int) -> bool:
        """Fold a page into the window, trimmed to ``budget`` bytes by size() (but never below
        the page); return whether readers have something new."""
        moved = False
        self.hint = max(self.hint, page.next_offset)
        self.shown = max(self.shown, page.next_offset)
        if page.pruned_to is not None:
            if self.start is not None and from_offset == self.end:
                # The chunks after the window are gone: readers past it ask for their own pages
                # (and learn what was pruned); the window starts again from the next page.
                self.start, self.end = None, 0
                self._empty()
                moved = True
            return moved
        if page.closed and self.final is None:
            self.final = page.next_offset
            moved = True
        count = len(page.values)
        if self.start is None:
            if count:
                self.start, self.end = from_offset, from_offset + count
                self._append(page.values, page.times, budget)
                moved = True
            elif from_offset >= page.next_offset:
                self.start = self.end = page.next_offset
                moved = True
        elif count and from_offset <= self.end < from_offset + count:
            new = self.end - from_offset
            self._append(page.values[new:], page.times[new:], budget)
            self.end = from_offset + count
            moved = True
        return moved

    def jump(self, pos: int) -> bool:
        """A reader at ``pos`` is ahead of the window: empty it, to be fetched from ``pos`` (or from
        the highest offset a page showed, if the reader is past it), rather than fetched forward
        through every chunk in between; readers in the old window read on by their own pages.
        Return whether it moved (then its waiters are to be woken to step again)."""
        start = min(pos, self.shown)
        if self.start is None or start <= self.end:
            return False
        self.start = self.end = start
        self._empty()
        return True

    def _empty(self) -> None:
        self.values, self.times, self.window_bytes = [], [], 0

    def _append(self, values: list[str | bytes], times: list[datetime.datetime], budget: int) -> None:
        # Trim from the front to the budget, but never below the page just added.
        self.values.extend(values)
        self.times.extend(times)
        self.window_bytes += sum(map(size, values))
        drop, droppable = 0, len(self.values) - len(values)
        while drop < droppable and self.window_bytes > budget:
            self.window_bytes -= size(self.values[drop])
            drop += 1
        if drop:
            del self.values[:drop], self.times[:drop]
            assert self.start is not None
            self.start += drop


def size(value: str | bytes) -> int:
    """About what a chunk of data ``value`` costs in a window, in bytes (its text as Python stores
    it: 1, 2 or 4 bytes a character, and a header)."""
    return sys.getsizeof(value) + CHUNK_OVERHEAD


def _chunks(
    stream_id: uuid.UUID, start: int, values: list[str | bytes], times: list[datetime.datetime]
) -> list[StreamChunk]:
    return list(map(StreamChunk, repeat(stream_id), range(start, start + len(values)), values, times))
