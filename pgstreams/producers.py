"""Idempotent producers: the check a write by (producer id, epoch, seq) passes before it is
stored, and the state it leaves, both in the write's own transaction, so that a write retried
after a lost answer is recognised instead of stored twice. Used by ``write()`` and the append
path (``batch``, for ``append()`` and the Durable Streams endpoint alike); the caller holds the
stream's row lock, which serialises a producer's writes.

Epochs fence old instances of a producer (a lower epoch is refused); within an epoch, seq counts
the producer's batches from 0 and a batch at or below the last one is a duplicate.
"""

from __future__ import annotations

from typing import Any, Final

from .exceptions import ProducerFenced, ProducerGap
from .types import Producer

# Epoch and seq are bigint.
MAX: Final = 2**63 - 1


def checked(producer: Any) -> Producer:
    """``producer`` as a Producer, if it is one: a non-empty id, epoch and seq from 0 to MAX."""
    if not isinstance(producer, tuple) or len(producer) != 3:
        raise TypeError(f"producer must be a pgstreams.Producer(id, epoch, seq), not {producer!r}")
    producer_id, epoch, seq = producer
    if not isinstance(producer_id, str) or not producer_id.strip():
        raise ValueError("a producer's id must be a non-empty str")
    for name, value in (("epoch", epoch), ("seq", seq)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX:
            raise ValueError(f"a producer's {name} must be an int from 0 to {MAX}, not {value!r}")
    return Producer(producer_id, epoch, seq)


def check(cursor: Any, stream_id: Any, producer: Producer) -> tuple[int, int] | None:
    """``judge()`` against the state the stream holds for ``producer``'s id."""
    cursor.execute(
        "SELECT epoch, seq FROM pgstreams_producer WHERE stream_id = %s AND producer_id = %s",
        [stream_id, producer.id],
    )
    return judge(cursor.fetchone(), producer)


def judge(state: tuple[int, int] | None, producer: Producer) -> tuple[int, int] | None:
    """None when ``producer`` names its next batch after ``state`` (the (epoch, seq) last written
    by its id, or None); (epoch, highest seq written) when this batch was written already.

    Raises:
        ProducerFenced: an older epoch than the stream has seen from this producer.
        ProducerGap: a seq past the next one (a new producer starts at 0).
        ValueError: a new epoch that does not start at seq 0.
    """
    if state is None:
        if producer.seq != 0:
            raise ProducerGap(producer.id, producer.seq, 0)
        return None
    epoch, seq = state
    if producer.epoch < epoch:
        raise ProducerFenced(producer.id, producer.epoch, epoch)
    if producer.epoch > epoch:
        if producer.seq != 0:
            raise ValueError(f"producer {producer.id!r} starts epoch {producer.epoch} at seq {producer.seq}, not 0")
        return None
    if producer.seq <= seq:
        return epoch, seq
    if producer.seq > seq + 1:
        raise ProducerGap(producer.id, producer.seq, seq + 1)
    return None


def save(cursor: Any, stream_id: Any, producer: Producer) -> None:
    """Record ``producer``'s batch as written (in the transaction that wrote it)."""
    cursor.execute(
        "INSERT INTO pgstreams_producer (stream_id, producer_id, epoch, seq) VALUES (%s, %s, %s, %s)"
        " ON CONFLICT (stream_id, producer_id) DO UPDATE SET epoch = excluded.epoch, seq = excluded.seq",
        [stream_id, producer.id, producer.epoch, producer.seq],
    )
