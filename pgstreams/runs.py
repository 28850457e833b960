"""Runs: consecutive chunks of a closed stream held in one row of ``pgstreams_chunk``, as
compaction writes them; how a row becomes chunks again; and how the reads take chunks from rows,
runs among them, cut as their queries cut rows of one chunk (``take``).

A run's row is keyed by its last chunk's offset, so that a read's range scan from any offset
inside it (``"offset" >= X``) finds it; its ``data`` (or ``blob``) holds its chunks' values end to
end, its ``created_at`` its last chunk's time (what "last write" asks), and its ``run`` each
chunk's length in bytes and its time, in microseconds before the row's. A row of one chunk, as
every writer writes them, has ``run`` NULL.

``run`` is, little-endian: a byte, the format (1); two bytes, the type codes (``array``'s) of the
lengths ('H' or 'I') and of the times ('i' or 'q'), each the narrowest that holds them; the
count of chunks (4 bytes); the lengths; the times.

Pure data: no SQL, no connections, no choice of what to compact (``maintenance`` does that).
"""

from __future__ import annotations

import datetime
import struct
import sys
from array import array
from collections.abc import Iterable
from itertools import accumulate
from typing import Final

FORMAT: Final = 1
_HEAD: Final = struct.Struct("<B2sI")
_MICROSECOND: Final = datetime.timedelta(microseconds=1)
UTC: Final = datetime.UTC

Value = str | bytes


class BadRun(ValueError):
    """A row's ``run`` this version cannot read."""


def _narrowest(values: list[int], codes: str) -> array[int]:
    for code in codes:
        try:
            return array(code, values)
        except OverflowError:
            continue
    raise OverflowError(f"{max(values, key=abs)} fits none of the types {codes}")


def _little(items: array[int]) -> bytes:
    if sys.byteorder == "big":
        items = array(items.typecode, items)
        items.byteswap()
    return items.tobytes()


def pack(values: list[Value], times: list[datetime.datetime]) -> tuple[Value, bytes, datetime.datetime]:
    """A run of chunks (their values and times, in offset order, at least one, all text or all
    bytes): the row's value, ``run`` and ``created_at``."""
    if not values or len(values) != len(times):
        raise ValueError("a run holds at least one chunk, each with its time")
    text = isinstance(values[0], str)
    encoded = [v.encode() if isinstance(v, str) else v for v in values] if text else values
    if any(isinstance(v, str) != text for v in values):
        raise ValueError("a run's chunks are all text or all bytes")
    last = times[-1]
    lengths = _narrowest([len(v) for v in encoded], "HI")
    # In UTC: two times of one zone subtract as wall-clock times, across a DST change too.
    before = _narrowest([(last.astimezone(UTC) - t.astimezone(UTC)) // _MICROSECOND for t in times], "iq")
    head = _HEAD.pack(FORMAT, (lengths.typecode + before.typecode).encode(), len(values))
    value: Value = "".join(values) if text else b"".join(values)  # type: ignore[arg-type]
    return value, head + _little(lengths) + _little(before), last


def unpack(value: Value, run: bytes, created_at: datetime.datetime) -> tuple[list[Value], list[datetime.datetime]]:
    """A run row's chunks: their values and times, in offset order."""
    lengths, before = _index(run)
    last = created_at.astimezone(UTC)  # as pack() counted, then in the row's zone again
    return split(value, lengths), [(last - b * _MICROSECOND).astimezone(created_at.tzinfo) for b in before]


def unpack_values(value: Value, run: bytes) -> list[Value]:
    """A run row's chunks' values, in offset order."""
    return split(value, _index(run)[0])


def _index(run: bytes) -> tuple[array[int], array[int]]:
    """A run's lengths and times, as ``run`` holds them."""
    try:
        version, codes, count = _HEAD.unpack_from(run)
        if version != FORMAT:
            raise BadRun(f"a run of format {version}, which this version of pgstreams does not read")
        lengths, before = array(chr(codes[0])), array(chr(codes[1]))
        at = _HEAD.size
        for items in (lengths, before):
            end = at + count * items.itemsize
            items.frombytes(bytes(run[at:end]))
            at = end
            if sys.byteorder == "big":
                items.byteswap()
    except BadRun:
        raise
    except (struct.error, ValueError) as exc:
        raise BadRun(f"a run's index is unreadable: {exc}") from None
    if len(lengths) != count or len(before) != count or at != len(run):
        raise BadRun("a run's index does not match its data")
    return lengths, before


def split(value: Value, lengths: array[int]) -> list[Value]:
    """``value`` cut at ``lengths`` (bytes, for text its UTF-8)."""
    data = value.encode() if isinstance(value, str) else bytes(value)
    if sum(lengths) != len(data):
        raise BadRun("a run's index does not match its data")
    ends = list(accumulate(lengths))
    starts = [0, *ends[:-1]]
    if isinstance(value, str):
        return [data[a:b].decode() for a, b in zip(starts, ends, strict=True)]
    return [data[a:b] for a, b in zip(starts, ends, strict=True)]


def take(
    rows: Iterable[tuple[int, Value, bytes | None, datetime.datetime | None]], start: int, chunks: int, size: int
) -> tuple[list[Value], list[datetime.datetime], int | None]:
    """The chunks from offset ``start`` in ``rows`` (offset, value, run, created_at: rows of one
    chunk or runs, in offset order, as the reads select them), consecutive, at most ``chunks``
    of them and none after those before it reach ``size`` bytes: their values and times (those
    of rows whose created_at is None are not asked for), and, when ``start`` itself is not held,
    the first offset that is (else None).

    The reads' queries cut rows of one chunk as this cuts chunks, so their rows are taken as
    they come; from the first run on (whose first row may start before ``start``), each chunk
    is counted here."""
    values: list[Value] = []
    times: list[datetime.datetime] = []
    cut: Cut | None = None
    expect = start
    for offset, value, run, created_at in rows:
        if run is None and cut is None:
            if offset != expect:
                return values, times, offset if not values else None
            values.append(value)
            times.append(created_at)  # type: ignore[arg-type]
            expect += 1
            continue
        if run is None:
            held, held_times = [value], [created_at]
        elif created_at is None:
            held, held_times = unpack_values(value, run), []
        else:
            held, held_times = unpack(value, run, created_at)
        first = offset - len(held) + 1
        if first > expect:
            return values, times, first if not values else None
        cut = cut or Cut(chunks, size, values)
        for i in range(expect - first, len(held)):
            if not cut.takes(held[i]):
                return values, times, None
            values.append(held[i])
            if held_times:
                times.append(held_times[i])  # type: ignore[arg-type]
            expect += 1
    return values, times, None


def lengths(run: bytes) -> list[int]:
    """A run's chunks' lengths in bytes, without its data."""
    return list(_index(run)[0])


class Cut:
    """A read's cut counted chunk by chunk, as the reads' queries count rows of one chunk: at most
    ``chunks`` chunks, none after those before it reach ``size`` bytes; ``taken`` are the
    chunks the read holds already."""

    def __init__(self, chunks: int, size: int, taken: list[Value]) -> None:
        self.chunks, self.size = chunks, size
        self.taken = len(taken)
        self.bytes = sum(map(octets, taken))

    def takes(self, value: Value) -> bool:
        """Whether ``value`` goes in (then it is counted)."""
        if self.taken >= self.chunks or self.bytes >= self.size:
            return False
        self.taken += 1
        self.bytes += octets(value)
        return True


def octets(value: Value) -> int:
    """A value's length as Postgres' ``octet_length`` gives it: bytes of UTF-8 for text."""
    return len(value.encode()) if isinstance(value, str) else len(value)


def count(run: bytes) -> int:
    """The chunks a run row holds (without unpacking them)."""
    try:
        return int(_HEAD.unpack_from(run)[2])
    except struct.error as exc:
        raise BadRun(f"a run's index is unreadable: {exc}") from None
