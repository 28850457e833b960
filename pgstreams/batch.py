"""One batch of the append path, in its transaction: the rows of the batch's streams read as last
committed, each item judged in arrival order against the streams as the batch leaves them so far
(``Item.judge``: closed, content type, an idempotent producer's epoch and seq, and whatever the
item's own kind adds), and everything accepted written in one statement: the chunks, the streams'
rows, the producers' states. That statement also locks the rows it writes, in id order, and writes
only to those still as they were read; one another transaction holds, or wrote meanwhile, is left
with its items for a later batch, never waited on (a refusal, of a stream written nothing, stands
on the rows as read: right for what never goes back, closed, deleted, a fenced epoch, a seq
already used; a producer's gap, though, is judged against the last committed seq even while the
one before it is being committed by another process, where a held row used to make it wait). The
server has the whole statement, its data with it, before it locks anything: a process stopped
while it sends a batch holds no row meanwhile (once the rows are locked, the idle bound of
``db.begin_bounded_sql`` holds). Each item's result is made once the offsets are known.

The items are what the callers hand the appender: ``Append`` for ``append()``/``aappend()``,
``Sends`` for a stream writer's chunks gathered while they wait, the Durable Streams endpoint's
own for HTTP appends, and ``Insert``s, which make new streams (the endpoint's plain creates):
each its own statement, all of them in a pipeline after the writes, in a savepoint of their own
so that one that cannot go in (its lock wait too long) costs the batch's appends nothing. No
threads, no queue and no retries here (``appender``), and no resolution of a commit that got no
answer (``resolution``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Final

import psycopg

from . import contents, producers
from .exceptions import StreamClosed, StreamError, StreamNotFound
from .types import Mark, Producer

# Whether a stream's expiry (Stream-Expires-At, or a TTL since its last use) has passed, by the
# database's clock at this moment (a transaction's now() is its start); NULL for neither. The
# Durable Streams endpoint judges expiry by the same expression.
EXPIRY_PASSED = "(expires_at <= clock_timestamp() OR used_at + make_interval(secs => ttl) <= clock_timestamp())"
# The batch's streams as last committed, in id order (no lock: WRITE_SQL takes it). Expired
# streams count as gone. Each row comes back under its place in the array sent, not its id: an
# int is cheaper to load than a UUID, and the batch has the ids already.
READ_SQL = f"""
SELECT w.n::int, content_type, next_offset, closed_at IS NOT NULL, writer_seq, owner_id, ttl, expires_at,
       deleted_at IS NOT NULL OR coalesce({EXPIRY_PASSED}, false)
FROM unnest(%b::uuid[]) WITH ORDINALITY AS w(id, n) JOIN pgstreams_stream AS s ON s.id = w.id
ORDER BY s.id
"""
PRODUCERS_SQL = """
SELECT p.stream_id, p.producer_id, p.epoch, p.seq
FROM pgstreams_producer AS p JOIN unnest(%s::uuid[], %s::text[]) AS w(stream_id, producer_id)
  ON p.stream_id = w.stream_id AND p.producer_id = w.producer_id
"""
# Everything the batch accepted, in one statement, its arrays sent in binary (cheaper to build),
# and sent empty where every element would be NULL or false (unnest pads the shorter arrays with
# NULLs; a NULL ``closing`` closes nothing). First the rows it writes are locked, in id order,
# those another transaction holds skipped (SKIP LOCKED: no wait, no deadlock), and those no longer
# as the batch read them (``was``: next_offset, writer_seq, owner; its producers' states; still
# open and not gone; and not written since this statement's snapshot, which a lock that found a
# later row version tells by its xmin) left out too: nothing of theirs is written. Then the
# locked streams' rows move (a closing item closes, writer_seq moves on, a stream with a TTL
# counts the write as use); their chunks go in; their producers' states move; the commit waits at
# SYNCHRONOUS_COMMIT, for this transaction only. Returns the streams not written (mostly none: a
# thousand ids written cost the client more to load than the statement's check of them).
WRITE_SQL = f"""
WITH locked AS MATERIALIZED (
    SELECT s.id
    FROM unnest(%(ids)b::uuid[], %(was_next)b::bigint[], %(was_seqs)b::text[], %(was_owners)b::text[])
        AS was(id, next_offset, writer_seq, owner_id)
    JOIN pgstreams_stream AS s ON s.id = was.id
    WHERE s.next_offset = was.next_offset AND s.writer_seq IS NOT DISTINCT FROM was.writer_seq
      AND s.owner_id::text IS NOT DISTINCT FROM was.owner_id
      AND s.closed_at IS NULL AND s.deleted_at IS NULL AND NOT coalesce({EXPIRY_PASSED}, false)
      AND s.xmin = (SELECT xmin FROM pgstreams_stream WHERE id = was.id)
      AND NOT EXISTS (
          SELECT FROM unnest(
              %(known_ids)b::uuid[], %(known_names)b::text[], %(known_epochs)b::bigint[], %(known_seqs)b::bigint[]
          ) AS k(stream_id, producer_id, epoch, seq)
          LEFT JOIN pgstreams_producer AS p ON p.stream_id = k.stream_id AND p.producer_id = k.producer_id
          WHERE k.stream_id = was.id AND (p.epoch, p.seq) IS DISTINCT FROM (k.epoch, k.seq)
      )
    ORDER BY s.id FOR NO KEY UPDATE OF s SKIP LOCKED
), moved AS (
    UPDATE pgstreams_stream AS s
    SET next_offset = m.next_offset,
        closed_at = CASE WHEN m.closing THEN coalesce(s.closed_at, now()) ELSE s.closed_at END,
        writer_seq = coalesce(m.writer_seq, s.writer_seq),
        used_at = CASE WHEN s.ttl IS NULL THEN s.used_at ELSE clock_timestamp() END
    FROM unnest(%(ids)b::uuid[], %(next)b::bigint[], %(closing)b::bool[], %(seqs)b::text[])
        AS m(id, next_offset, closing, writer_seq)
    WHERE s.id = m.id AND m.id IN (SELECT id FROM locked)
), written AS (
    INSERT INTO pgstreams_chunk (stream_id, "offset", data, blob, created_at)
    SELECT c.stream_id, c.off, c.data, c.blob, now()
    FROM unnest(%(chunk_ids)b::uuid[], %(offsets)b::bigint[], %(texts)b::text[], %(blobs)b::bytea[])
        AS c(stream_id, off, data, blob)
    WHERE c.stream_id IN (SELECT id FROM locked)
), saved AS (
    INSERT INTO pgstreams_producer (stream_id, producer_id, epoch, seq)
    SELECT * FROM unnest(
        %(producer_ids)b::uuid[], %(producer_names)b::text[], %(epochs)b::bigint[], %(pseqs)b::bigint[]
    ) AS v(stream_id, producer_id, epoch, seq)
    WHERE v.stream_id IN (SELECT id FROM locked)
    ON CONFLICT (stream_id, producer_id) DO UPDATE SET epoch = excluded.epoch, seq = excluded.seq
)
SELECT pg_current_xact_id()::text, pg_backend_pid(),
       set_config('synchronous_commit', coalesce(%(level)s, current_setting('synchronous_commit')), true),
       array(SELECT id FROM unnest(%(ids)b::uuid[]) AS m(id) WHERE id NOT IN (SELECT id FROM locked))
"""

Result = Any  # what a caller gets: its item's result, or the exception that refused it


@dataclass(slots=True, eq=False)
class Row:
    """One stream as the batch found it, and as it leaves it so far."""

    id: uuid.UUID
    content_type: str
    next_offset: int
    closed: bool
    writer_seq: str | None
    owner_id: Any
    ttl: int | None
    expires_at: Any
    gone: bool  # deleted (a tombstone) or expired: for a writer, no stream
    moved: bool = False  # this batch changes its row
    closing: bool = False  # this batch closes it
    first: int | None = None  # the first offset this batch gives it

    @property
    def kind(self) -> contents.Kind:
        return contents.kind_of(self.content_type)


@dataclass(slots=True)
class Accepted:
    """What an item's judge lets the batch do: write ``chunks`` (there may be none), close the
    stream, move its ``writer_seq`` on, record the ``producer``'s batch; or nothing, for a
    producer's batch written already (``duplicate``: the producer's epoch and highest seq).
    ``refused``: why the item's chunks after ``chunks`` cannot go in (a stream writer's gathered
    chunks, of which those before a misfit commit): the item fails with it once they have."""

    chunks: list[str | bytes]
    closing: bool = False
    writer_seq: str | None = None
    producer: Producer | None = None
    duplicate: tuple[int, int] | None = None
    refused: BaseException | None = None
    next_offset: int = 0  # the stream as this item leaves it (set by the batch)
    closed: bool = False


class NotJudged(Exception):
    """An item that cannot be judged as it was submitted (what it was made from is out of date):
    nothing of it is written, whatever becomes of its batch, and its caller may submit it anew."""


class Chain:
    """The items of one stream writer: once one of them fails, the later ones (its close too)
    fail with it instead of committing after it (a stream with a hole in the middle would look
    whole). Its chunks' items have no futures: the appender tells the chain, on its writer's
    event loop, how many more of their chunks have their results (``settled``); the close has
    one."""

    __slots__ = ("failure",)

    def __init__(self) -> None:
        self.failure: BaseException | None = None  # the first, set by the appender's thread

    def settled(self, count: int) -> None:
        """``count`` more of its items' chunks have their results (called on the writer's event loop)."""


@dataclass(slots=True, eq=False)
class Item:
    """One call's append: where it goes, the future its caller waits on (in ``loop``, or None:
    a thread's; None for a stream writer's chunks, which its ``chain`` counts), and the chain it
    belongs to, if any. Subclasses judge it."""

    stream_id: uuid.UUID
    future: asyncio.Future[Any] | concurrent.futures.Future[Any] | None
    loop: asyncio.AbstractEventLoop | None = None
    chain: Chain | None = None
    producer: Producer | None = None
    waits_until: float | None = None  # set when its stream was first found held by another transaction

    @property
    def size(self) -> int:
        """The chunks it may write, for APPEND_BATCH."""
        return 1

    @property
    def data_size(self) -> int:
        """About the data it may write (characters of text, bytes), for a batch's BATCH_BYTES."""
        return 0

    def judge(self, row: Row | None, producer_state: tuple[int, int] | None) -> Accepted | BaseException:
        raise NotImplementedError

    def result(self, row: Row, first: int | None, accepted: Accepted) -> Result:
        """The caller's result, once committed: ``first`` is the first chunk's offset (None if
        it wrote none)."""
        raise NotImplementedError

    def held(self) -> BaseException:
        """Why it failed after its stream was held by another transaction for QUERY_TIMEOUT."""
        return StreamError(
            f"stream {self.stream_id} was held by another transaction (a write in a transaction still "
            "open?) for QUERY_TIMEOUT; append again once it ends"
        )


@dataclass(slots=True, eq=False)
class Append(Item):
    """``append()`` and ``aappend()``: one text chunk, and the stream's close with it if
    ``closing``; its result the chunk's offset (None for an idempotent producer's batch written
    already)."""

    data: str = ""
    closing: bool = False

    @property
    def data_size(self) -> int:
        return len(self.data)

    def judge(self, row: Row | None, producer_state: tuple[int, int] | None) -> Accepted | BaseException:
        sid = self.stream_id
        if row is None or row.gone:
            return StreamNotFound(f"no stream {sid}")
        if self.producer is not None:
            try:
                duplicate = producers.judge(producer_state, self.producer)
                if duplicate is not None:
                    return Accepted([], duplicate=duplicate)
            except (StreamError, ValueError) as exc:
                return exc
        if row.closed:
            return StreamClosed(f"stream {sid} was closed; create a new stream to write more")
        return self.fit(row.kind)

    def fit(self, kind: contents.Kind) -> Accepted | BaseException:
        """What it writes to an open stream of ``kind``, or why it cannot."""
        try:
            contents.check_fits(kind, self.data, self.stream_id)
        except StreamError as exc:
            return exc
        return Accepted([self.data], closing=self.closing, producer=self.producer)

    def result(self, row: Row, first: int | None, accepted: Accepted) -> Result:
        return first


@dataclass(slots=True, eq=False)
class Sends(Append):
    """A stream writer's chunks that wait for a batch together (``gathered``, not ``data``; no
    close, no producer): its ``send()`` adds to the one it submitted last until the appender
    takes it (``taken``, set under the appender's lock). One item whatever their number, one
    object in memory where there would be one per chunk: judged, written and settled as one,
    except that the chunks before one its stream's content type cannot hold still commit
    (``Accepted.refused``), and that the appender cuts a lone one in halves as it does a batch
    (the database refused it, or it did not commit). Its result: its first offset, or why its
    chunks, or the last of them, failed."""

    gathered: list[str] = field(default_factory=list)
    chars: int = 0  # of the gathered chunks' data
    taken: bool = False

    @property
    def size(self) -> int:
        return len(self.gathered)

    @property
    def data_size(self) -> int:
        return self.chars

    def fit(self, kind: contents.Kind) -> Accepted | BaseException:
        for k, data in enumerate(self.gathered):
            try:
                contents.check_fits(kind, data, self.stream_id)
            except StreamError as exc:
                return Accepted(self.gathered[:k], refused=exc) if k else exc
        return Accepted(self.gathered)

    def result(self, row: Row, first: int | None, accepted: Accepted) -> Result:
        return first if accepted.refused is None else accepted.refused

    def halves(self) -> tuple[Sends, Sends]:
        """Its chunks cut in two, in order, each half an item of its own (taken, as it is)."""
        half = len(self.gathered) // 2
        first, second = self.gathered[:half], self.gathered[half:]
        return (
            replace(self, gathered=first, chars=sum(map(len, first))),
            replace(self, gathered=second, chars=sum(map(len, second))),
        )


@dataclass(slots=True, eq=False)
class Insert(Item):
    """An item that makes a new stream (``stream_id`` its id) instead of writing to one: its row's
    ``values``, for its class's ``INSERT_SQL`` (one row, ``ON CONFLICT DO NOTHING RETURNING id``),
    which the batch runs with its other inserts, each waiting at most its class's ``LOCK_WAIT``
    seconds for another transaction (one making a stream at the same path). Its result says
    whether the row went in: False when its path was taken, or when the batch's inserts could not
    be made (then none of them was), for its caller to make it another way."""

    INSERT_SQL: ClassVar[str]
    LOCK_WAIT: ClassVar[float]
    values: list[Any] = field(default_factory=list)


# In ``Outcome.results``: the item waits for a later batch (its stream is held).
DEFERRED: Final = object()


@dataclass
class Outcome:
    """One try of a batch in its transaction, before the commit."""

    results: list[Result]  # per item, in order: its result, its refusal, or DEFERRED
    marks: list[Mark]  # of the streams written or closed
    places: list[tuple[uuid.UUID, int]]  # each written stream's first new chunk: how to resolve
    closed: list[Mark] = field(default_factory=list)  # of the streams this batch closed
    written: int = 0  # chunks
    xid: str | None = None  # the transaction, if it wrote anything
    pid: int | None = None  # its backend
    deferred: list[Item] = field(default_factory=list)  # in order


def run(
    conn: psycopg.Connection[Any],
    items: list[Item],
    level: str | None,
    prepare: bool,
    held: frozenset[uuid.UUID] = frozenset(),
) -> Outcome:
    """Judge and write ``items`` in the transaction open on ``conn``; the caller commits. Items
    of the streams in ``held`` are deferred, as those of streams another transaction holds or
    wrote since they were read."""
    inserts = [item for item in items if isinstance(item, Insert)]
    ids = list({item.stream_id: None for item in items if not isinstance(item, Insert)})
    rows: dict[uuid.UUID, Row] = {}
    if ids:
        found = conn.execute(READ_SQL, [ids], prepare=prepare).fetchall()
        rows = {row.id: row for row in (Row(ids[n - 1], *rest) for n, *rest in found)}
    was = {row.id: (row.next_offset, row.writer_seq) for row in rows.values()}  # as read: WRITE_SQL checks
    states = _producer_states(conn, items, rows)
    known = dict(states)  # as read, likewise
    results: list[Result] = []
    accepted: list[tuple[int, Row, Accepted, int | None]] = []  # by the item's index
    broken: dict[Chain, BaseException] = {}
    for i, item in enumerate(items):
        chain, sid = item.chain, item.stream_id
        if inserts and isinstance(item, Insert):
            results.append(None)  # made below, after the writes
            continue
        if chain is not None and chain in broken:
            cause = broken[chain]
            results.append(error(StreamError, f"an earlier chunk of this writer failed: {cause}", cause))
            continue
        if held and sid in held:  # a UUID's hash is a Python call: skip it for none held
            results.append(DEFERRED)
            continue
        row = rows.get(sid)
        key = (sid, item.producer.id) if item.producer is not None else None
        verdict = item.judge(row, states.get(key) if key else None)
        results.append(verdict)  # an accepted item's result is made below, once written
        if isinstance(verdict, BaseException):
            if chain is not None:
                broken[chain] = verdict
            continue
        if verdict.refused is not None and chain is not None:
            broken[chain] = verdict.refused
        assert row is not None
        first = _apply(row, verdict)
        verdict.next_offset, verdict.closed = row.next_offset, row.closed
        if key is not None and verdict.producer is not None:
            states[key] = (verdict.producer.epoch, verdict.producer.seq)
        accepted.append((i, row, verdict, first))
    outcome = Outcome(results, [], [])
    moved = [row for row in rows.values() if row.moved]
    if moved:
        params = _params(accepted, moved, states, level) | _was(items, moved, was, known)
        xid, pid, _, skipped = conn.execute(WRITE_SQL, params, prepare=prepare).fetchone()
        if skipped:  # their items wait for a later batch, judged anew
            lost = set(skipped)
            for i, item in enumerate(items):
                if item.stream_id in lost and not isinstance(item, Insert):
                    results[i] = DEFERRED
            accepted = [entry for entry in accepted if entry[1].id not in lost]
            moved = [row for row in moved if row.id not in lost]
    if moved:
        outcome.xid, outcome.pid = xid, pid
        outcome.marks = [Mark(row.id, row.next_offset, row.closed) for row in moved]
        outcome.closed = [mark for mark, row in zip(outcome.marks, moved, strict=True) if row.closing]
        outcome.places = [(row.id, row.first) for row in moved if row.first is not None]
        outcome.written = sum(len(verdict.chunks) for _, _, verdict, _ in accepted)
    for i, row, verdict, first in accepted:
        results[i] = items[i].result(row, first, verdict)
    outcome.deferred = [item for item, result in zip(items, results, strict=True) if result is DEFERRED]
    if inserts:
        made = _insert(conn, inserts, level)
        for i, item in enumerate(items):
            if isinstance(item, Insert):
                results[i] = item.stream_id in made
        if made and outcome.xid is None:  # so that a commit that gets no answer can be resolved
            outcome.xid, outcome.pid = conn.execute(XACT_SQL).fetchone()
    return outcome


XACT_SQL = "SELECT pg_current_xact_id()::text, pg_backend_pid()"


def _insert(conn: psycopg.Connection[Any], inserts: list[Insert], level: str | None) -> set[uuid.UUID]:
    """Run ``inserts`` (of one class) in a pipeline, in a savepoint with lock waits bounded by
    their ``LOCK_WAIT`` and foreign keys checked at once (Django's are checked at the COMMIT, which
    a user deleted meanwhile would fail, with the batch's appends): the ids of those that went in;
    none, with nothing of them kept, if any failed (the rest of the transaction goes on as if
    they had not been tried). The transaction then commits at ``level``, as one that writes
    does. After the inserts it writes nothing more, so the constraints' mode is not set back."""
    try:
        with conn.cursor() as cursor:
            with conn.pipeline():
                conn.execute("SAVEPOINT pgstreams_inserts")
                conn.execute("SET CONSTRAINTS ALL IMMEDIATE")
                if level is not None:
                    conn.execute("SELECT set_config('synchronous_commit', %s, true)", [level])
                kind = type(inserts[0])
                conn.execute(f"SET LOCAL lock_timeout = '{int(kind.LOCK_WAIT * 1000)}ms'")  # the code's constant
                cursor.executemany(kind.INSERT_SQL, [item.values for item in inserts], returning=True)
                conn.execute("RELEASE SAVEPOINT pgstreams_inserts")
                conn.execute("SET LOCAL lock_timeout TO DEFAULT")
            made = set()  # from the inserts' results, one set each
            while True:
                if (row := cursor.fetchone()) is not None:
                    made.add(row[0])
                if not cursor.nextset():
                    return made
    except psycopg.Error:
        if conn.broken:
            raise
        conn.execute("ROLLBACK TO SAVEPOINT pgstreams_inserts")  # and the lock_timeout set after it
        conn.execute("RELEASE SAVEPOINT pgstreams_inserts")
        return set()


def _producer_states(conn: psycopg.Connection[Any], items: list[Item], rows: dict[uuid.UUID, Row]) -> dict:
    pairs = {
        (item.stream_id, item.producer.id) for item in items if item.producer is not None and item.stream_id in rows
    }
    if not pairs:
        return {}
    sids, names = zip(*pairs, strict=True)
    found = conn.execute(PRODUCERS_SQL, [list(sids), list(names)]).fetchall()
    return {(sid, name): (epoch, seq) for sid, name, epoch, seq in found}


def _apply(row: Row, verdict: Accepted) -> int | None:
    """What an accepted item does to its stream's row; the offset of its first chunk."""
    first = None
    if verdict.chunks:
        first = row.next_offset
        if row.first is None:
            row.first = first
        row.next_offset += len(verdict.chunks)
        row.moved = True
    if verdict.closing and not row.closed:
        row.closed = row.closing = row.moved = True
    if verdict.writer_seq is not None:
        row.writer_seq, row.moved = verdict.writer_seq, True
    if verdict.producer is not None:
        row.moved = True  # its state is saved: the batch writes
    return first


def _params(
    accepted: list[tuple[int, Row, Accepted, int | None]], moved: list[Row], states: dict, level: str | None
) -> dict[str, Any]:
    chunk_ids: list[uuid.UUID] = []
    offsets: list[int] = []
    texts: list[str | None] = []
    blobs: list[bytes | None] = []
    any_bytes = False
    saved: dict[tuple[uuid.UUID, str], tuple[int, int]] = {}
    for _, row, verdict, first in accepted:
        if first is not None:
            chunks, n = verdict.chunks, len(verdict.chunks)
            chunk_ids += [row.id] * n
            offsets += range(first, first + n)
            if all(type(chunk) is str for chunk in chunks):  # all text (the append path's own)
                texts += chunks
                blobs += [None] * n
            else:
                texts += [chunk if isinstance(chunk, str) else None for chunk in chunks]
                blobs += [chunk if isinstance(chunk, bytes) else None for chunk in chunks]
                any_bytes = True
        if verdict.producer is not None:
            saved[(row.id, verdict.producer.id)] = states[(row.id, verdict.producer.id)]
    closing = [row.closing for row in moved]
    seqs = [row.writer_seq for row in moved]
    return {
        "ids": [row.id for row in moved],
        "next": [row.next_offset for row in moved],
        "closing": closing if any(closing) else [],
        "seqs": seqs if any(seq is not None for seq in seqs) else [],
        "chunk_ids": chunk_ids,
        "offsets": offsets,
        "texts": texts,
        "blobs": blobs if any_bytes else [],
        "producer_ids": [sid for sid, _ in saved],
        "producer_names": [name for _, name in saved],
        "epochs": [epoch for epoch, _ in saved.values()],
        "pseqs": [seq for _, seq in saved.values()],
        "level": level,
    }


def _was(
    items: list[Item], moved: list[Row], was: dict[uuid.UUID, tuple[int, str | None]], known: dict
) -> dict[str, Any]:
    """WRITE_SQL's check: the ``moved`` rows as read (next_offset, writer_seq, owner), and the
    states read of the producers judged on them (None for none yet)."""
    seqs = [was[row.id][1] for row in moved]
    owners = [None if row.owner_id is None else str(row.owner_id) for row in moved]
    ids = {row.id for row in moved}
    judged = {(item.stream_id, item.producer.id) for item in items if item.producer is not None}
    pairs = [(key, known.get(key)) for key in judged if key[0] in ids]
    return {
        "was_next": [was[row.id][0] for row in moved],
        "was_seqs": seqs if any(seq is not None for seq in seqs) else [],
        "was_owners": owners if any(owner is not None for owner in owners) else [],
        "known_ids": [sid for (sid, _), _ in pairs],
        "known_names": [name for (_, name), _ in pairs],
        "known_epochs": [state[0] if state else None for _, state in pairs],
        "known_seqs": [state[1] if state else None for _, state in pairs],
    }


def error(kind: type[Exception], message: str, cause: BaseException) -> Exception:
    """A ``kind`` error with ``message``, caused by ``cause``."""
    error = kind(message)
    error.__cause__ = cause
    return error
