"""The listener's queries and their connections: one query fetches the pages of many streams in
one snapshot; with READ_DATABASE, one asks the primary about the streams readers start on.

Pure database work for the listener: no tails, no readers, no locks. A query the database
refuses (not a lost connection) is retried key by key, so that only the keys it refuses alone
fail (``fetch_pages``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from itertools import chain, groupby
from operator import itemgetter
from typing import Any, Final

import psycopg

from . import conf, db, runs
from .types import Mark
from .window import Page

logger = logging.getLogger("pgstreams.listener")

Key = tuple[uuid.UUID, int]  # (stream, from_offset): one page
Connect = Callable[[str, str], Awaitable[psycopg.AsyncConnection[Any]]]
Disconnect = Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]

# A page holds at most this many chunks, and ends with the chunk that reaches this many bytes of
# data (of text in UTF-8, or binary): what a reader is handed at once, and what a tail's window
# holds at least, is bounded in bytes whatever the chunks' size.
PAGE_SIZE: Final = 500
PAGE_BYTES: Final = 512 << 10
# Pages fetched at most in one query (fewer after a query ran out of time: see the listener).
FETCH_KEYS: Final = 256

# One snapshot gives each stream's state and the chunks from the wanted offset, so "closed, and
# next_offset is N" and "every chunk below N is here" are seen together. A page's chunks are
# counted in bytes as they come, from their values' headers: no value past the page is detoasted
# or sent (its rows are read, up to PAGE_SIZE). A run (runs.py: a compacted stream's row of many
# chunks) counts whole, except the first row's, which may hold chunks before the offset: the rows
# past the page that this lets in are cut in Python, chunk by chunk (``pages_from_rows``). The
# arrays go in binary (%b): a thousand ids cost a copy, not a thousand quoted strings.
FETCH_SQL = """
SELECT w.i, s.next_offset, s.closed_at IS NOT NULL, c."offset", c.data, c.blob, c.created_at, c.run
FROM unnest(%b::uuid[], %b::bigint[]) WITH ORDINALITY AS w(stream_id, from_offset, i)
LEFT JOIN pgstreams_stream AS s ON s.id = w.stream_id AND s.deleted_at IS NULL  -- a tombstone is no stream
LEFT JOIN LATERAL (
    SELECT p."offset", p.data, p.blob, p.created_at, p.run FROM (
        SELECT k."offset", k.data, k.blob, k.created_at, k.run,
               sum(coalesce(octet_length(k.data), octet_length(k.blob))) OVER w
               - coalesce(octet_length(k.data), octet_length(k.blob))
               - first_value(CASE WHEN k.run IS NULL THEN 0 ELSE coalesce(octet_length(k.data), octet_length(k.blob))
                             END) OVER w AS before
        FROM pgstreams_chunk AS k
        WHERE k.stream_id = w.stream_id AND k."offset" >= w.from_offset
        WINDOW w AS (ORDER BY k."offset")
        ORDER BY k."offset"
        LIMIT %s
    ) AS p
    WHERE p.before < %s
) AS c ON true
ORDER BY w.i, c."offset"
"""

# With READ_DATABASE: what the primary says of streams readers start on.
PRIMARY_STATE_SQL = (
    "SELECT id, next_offset, closed_at IS NOT NULL FROM pgstreams_stream WHERE id = ANY(%s) AND deleted_at IS NULL"
)


class Connections:
    """The fetcher's connections: to READ_DATABASE (or DATABASE), and, when readers read from
    another database than the primary, one to the primary, opened on first use."""

    def __init__(self, connect: Connect, disconnect: Disconnect) -> None:
        self.standby = conf.read_database() != conf.database()
        self._connect = connect
        self._disconnect = disconnect
        self._read: psycopg.AsyncConnection[Any] | None = None
        self._primary: psycopg.AsyncConnection[Any] | None = None

    async def read(self) -> psycopg.AsyncConnection[Any]:
        if self._read is None or self._read.closed:
            self._read = await self._connect(conf.read_database(), "fetcher")
        return self._read

    async def primary(self) -> psycopg.AsyncConnection[Any]:
        if self._primary is None or self._primary.closed:
            self._primary = await self._connect(conf.database(), "checker")
        return self._primary

    async def close(self) -> None:
        for conn in (self._read, self._primary):
            if conn is not None:
                await self._disconnect(conn)
        self._read = self._primary = None


async def fetch_pages(
    conn: psycopg.AsyncConnection[Any], keys: list[Key], refuse: Callable[[Key, Exception], None]
) -> dict[Key, Page]:
    """The pages of ``keys``, in one query. When the database refuses the query itself (not
    the connection: a value out of range, a row the client cannot load), fetch key by key and
    hand each key refused alone to ``refuse``."""
    try:
        return await _fetch(conn, keys)
    except (psycopg.DatabaseError, runs.BadRun) as exc:
        if not _refused(exc, conn):
            raise
        logger.warning(
            "pgstreams: the database refused a fetch of %d page(s), fetching them one by one: %s", len(keys), exc
        )
    pages: dict[Key, Page] = {}
    for key in keys:
        try:
            pages.update(await _fetch(conn, [key]))
        except (psycopg.DatabaseError, runs.BadRun) as exc:
            if not _refused(exc, conn):
                raise
            refuse(key, exc)
    return pages


async def confirm_on_primary(
    conns: Connections, ask: set[uuid.UUID], pages: dict[Key, Page]
) -> tuple[list[Mark], bool]:
    """With READ_DATABASE: what the primary says of the streams in ``ask`` (those readers start
    on, to which this adds the streams the standby does not show), as marks to announce: a
    standby may not have replayed their last chunks, or the stream itself, and no notification
    would announce those again. Pages of streams the standby does not have yet are taken out of
    ``pages`` (their readers' requests stay open); the flag says whether any was."""
    ask = ask | {stream_id for (stream_id, _), page in pages.items() if not page.exists}
    if not ask:
        return [], False
    primary = await conns.primary()
    async with db.deadline(primary, "asking the primary"):
        cursor = await primary.execute(PRIMARY_STATE_SQL, (list(ask),), prepare=False)
        marks = [Mark(*row) for row in await cursor.fetchall()]
    on_primary = {mark.stream_id for mark in marks}
    held = [key for key, page in pages.items() if not page.exists and key[0] in on_primary]
    for key in held:
        del pages[key]
    return marks, bool(held)


async def _fetch(conn: psycopg.AsyncConnection[Any], keys: list[Key]) -> dict[Key, Page]:
    # Not prepared: planned with the table's current size each time. A generic plan cached while
    # the chunk table was small can scan all of it once it has grown.
    params = ([k[0] for k in keys], [k[1] for k in keys], PAGE_SIZE, PAGE_BYTES)
    async with db.deadline(conn, "fetching chunks"):
        cursor = await conn.execute(FETCH_SQL, params, prepare=False)
        rows = await cursor.fetchall()
    return pages_from_rows(keys, rows)


def pages_from_rows(keys: list[Key], rows: list[tuple[Any, ...]]) -> dict[Key, Page]:
    """FETCH_SQL's rows as pages: each page's chunks are consecutive from its offset and stop
    at a gap; a page whose first offset is gone though the stream is past it says where reading
    can resume (``pruned_to``). Rows of runs (compacted streams) are unpacked by ``runs.take``;
    a fetch without any, as every fetch of open streams is, takes its rows as they come."""
    pages = _pages(keys, rows) if any(map(itemgetter(7), rows)) else _plain_pages(keys, rows)
    for (_, from_offset), page in pages.items():
        if page.exists and not page.values and page.pruned_to is None and from_offset < page.next_offset:
            page.pruned_to = page.next_offset
    return pages


def _plain_pages(keys: list[Key], rows: list[tuple[Any, ...]]) -> dict[Key, Page]:
    """``runs.take``'s rule for rows of one chunk each, inline: a page's rows are taken while
    their offsets follow on (the query cut them)."""
    pages: dict[Key, Page] = {}
    at = 0  # the rows come by key (ordered by i): a page is looked up once, not once a row
    for i, next_offset, closed, offset, data, blob, created_at, _ in rows:
        if i != at:
            at, key = i, keys[i - 1]
            expect = key[1]  # the offset the page's next chunk must have
            page = pages[key] = Page(next_offset is not None, next_offset or 0, bool(closed))  # exists, next, closed
        if offset is None or page.pruned_to is not None:
            continue
        if offset == expect:
            value = blob if data is None else data
            page.values.append(value)
            page.times.append(created_at)
            page.data += len(value)
            expect += 1
        elif not page.values:
            page.pruned_to = offset  # offsets are the truth: never hand a chunk out under another
    return pages


def _pages(keys: list[Key], rows: list[tuple[Any, ...]]) -> dict[Key, Page]:
    pages: dict[Key, Page] = {}
    for i, group in groupby(rows, key=itemgetter(0)):  # the rows come by key (ordered by i)
        first = next(group)
        key = keys[i - 1]
        page = pages[key] = Page(first[1] is not None, first[1] or 0, bool(first[2]))  # exists, next, closed
        if first[3] is None:
            continue  # no chunk from its offset
        chunks = (
            (offset, blob if data is None else data, run, created_at)
            for _, _, _, offset, data, blob, created_at, run in chain((first,), group)
        )
        page.values, page.times, page.pruned_to = runs.take(chunks, key[1], PAGE_SIZE, PAGE_BYTES)
        page.data = sum(map(len, page.values))
    return pages


def _refused(exc: Exception, conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether the database refused the query itself, or gave a row that cannot be read (a run
    whose index is corrupt), on a connection that still works (not a lost connection, nor a
    query cut off by its deadline)."""
    return not isinstance(exc, psycopg.OperationalError) and not conn.broken
