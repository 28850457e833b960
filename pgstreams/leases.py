"""Writers' leases on open streams. A writer that may die mid-stream (a model's answer, a job's
log) renews a lease on its stream while it writes, naming the chunk that is to end the stream if
it stops renewing; a reader that finds the stream silent and the lease run out appends that
chunk and closes the stream, in one transaction of the append path, so that no reader waits
forever for a writer that is gone. A stream can be leased before its writer starts, for the time
it may wait for one, with a last chunk of its own (``aisdk.create_answer`` does): a renewal
replaces the lease whole, its time and its last chunk. The lease is kept in the stream's
metadata (``KEY``), by the database's clock, so processes whose clocks differ agree on it.

Not here: when readers ask (``aisdk.response`` and the Durable Streams endpoint's live reads do,
after a silence), and what the last chunk says (the writer's choice). A stream without a lease
is never ended this way, and readers never end a generation's stream: its lease run out is taken
over by another run of its task (``generations``). A writer that comes back to a stream a reader
ended finds it closed.
"""

from __future__ import annotations

from typing import Any, Final

from django.db import connections

from . import appends, conf, threads
from .exceptions import StreamClosed
from .types import stream_uuid

KEY: Final = "pgstreams_lease"

_RENEW_SQL: Final = (
    "UPDATE pgstreams_stream SET metadata = jsonb_set(metadata, '{pgstreams_lease}', jsonb_build_object("
    "'until', extract(epoch FROM now()) + %s, 'last', %s::text)) WHERE id = %s AND closed_at IS NULL"
)
# A generation's lease run out is taken over, not ended (generations.py).
_EXPIRED_SQL: Final = (
    "SELECT metadata->'pgstreams_lease'->>'last' FROM pgstreams_stream WHERE id = %s AND closed_at IS NULL "
    "AND (metadata->'pgstreams_lease'->>'until')::float8 < extract(epoch FROM now()) "
    "AND NOT metadata ? 'pgstreams_generation'"
)


def renew(stream_id: Any, seconds: float, last: str, *, using: str | None = None) -> None:
    """Lease an open stream for ``seconds`` from now: after that, a reader may end it with
    ``last`` (a chunk the stream's content type holds). A closed stream is left as it is."""
    with connections[using or conf.database()].cursor() as cursor:
        cursor.execute(_RENEW_SQL, [seconds, last, stream_uuid(stream_id)])


def expired(stream_id: Any, *, using: str | None = None) -> str | None:
    """The chunk to end an open stream with, if its lease has run out; None otherwise (no lease,
    a lease still running, or a closed stream)."""
    with connections[using or conf.database()].cursor() as cursor:
        cursor.execute(_EXPIRED_SQL, [stream_uuid(stream_id)])
        row = cursor.fetchone()
    return None if row is None else row[0]


arenew = threads.writes.wrap(renew)
_aexpired = threads.lookups.wrap(expired)


async def aend_if_expired(stream_id: Any, *, using: str | None = None) -> bool:
    """End an open stream whose lease has run out with the lease's last chunk; True if this
    ended it (False also when its writer or another reader ended it first)."""
    last = await _aexpired(stream_id, using=using)
    if last is None:
        return False
    try:
        await appends.aappend(stream_id, last, close=True, using=using)
    except StreamClosed:
        return False
    return True
