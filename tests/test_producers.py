"""Idempotent producers from Python: ``write(..., producer=Producer(id, epoch, seq))`` stores a
batch once however often it is retried, fences old epochs, refuses gaps, and keeps its state in
the write's own transaction."""

from __future__ import annotations

import json
import threading
import time

import pytest
from django.db import connection, transaction

import pgstreams
from bench.pgserver import ServerControl
from pgstreams import Producer
from pgstreams.models import Chunk
from tests.helpers import Rollback
from tests.test_faults import _forget_dead_connections

pytestmark = pytest.mark.django_db(transaction=True)


def _stored(stream) -> list[str]:
    return list(Chunk.objects.filter(stream=stream).order_by("offset").values_list("data", flat=True))


def test_a_retried_write_returns_none_and_is_stored_once() -> None:
    stream = pgstreams.create_stream()
    assert pgstreams.write(stream, "a", producer=Producer("p", 0, 0)) == 0
    assert pgstreams.write(stream, "a", producer=Producer("p", 0, 0)) is None  # the retry
    assert pgstreams.write_many(stream, ["b", "c"], producer=Producer("p", 0, 1)) == [1, 2]
    assert pgstreams.write_many(stream, ["b", "c"], producer=Producer("p", 0, 1)) == []
    assert pgstreams.write(stream, "a", producer=Producer("p", 0, 0)) is None  # an older batch
    assert _stored(stream) == ["a", "b", "c"]


def test_producers_are_independent_and_epochs_fence_old_instances() -> None:
    stream = pgstreams.create_stream()
    pgstreams.write(stream, "x0", producer=Producer("x", 0, 0))
    pgstreams.write(stream, "y0", producer=Producer("y", 0, 0))
    pgstreams.write(stream, "x-new", producer=Producer("x", 1, 0))  # x restarted
    with pytest.raises(pgstreams.ProducerFenced) as fenced:
        pgstreams.write(stream, "x-zombie", producer=Producer("x", 0, 1))
    assert fenced.value.epoch == 1
    with pytest.raises(ValueError, match="starts epoch 2 at seq 3"):
        pgstreams.write(stream, "x", producer=Producer("x", 2, 3))
    assert _stored(stream) == ["x0", "y0", "x-new"]


def test_a_gap_in_seq_is_refused_and_writes_nothing() -> None:
    stream = pgstreams.create_stream()
    with pytest.raises(pgstreams.ProducerGap) as new:
        pgstreams.write(stream, "late", producer=Producer("p", 0, 1))
    assert new.value.expected == 0
    pgstreams.write(stream, "first", producer=Producer("p", 0, 0))
    with pytest.raises(pgstreams.ProducerGap) as gap:
        pgstreams.write(stream, "third", producer=Producer("p", 0, 2))
    assert gap.value.expected == 1
    assert _stored(stream) == ["first"]


def test_the_producer_state_rolls_back_with_its_write() -> None:
    stream = pgstreams.create_stream()
    with pytest.raises(Rollback), transaction.atomic():
        pgstreams.write(stream, "lost", producer=Producer("p", 0, 0))
        raise Rollback
    assert pgstreams.write(stream, "kept", producer=Producer("p", 0, 0)) == 0  # not taken for a duplicate
    assert _stored(stream) == ["kept"]


@pytest.mark.parametrize(
    "bad",
    [("", 0, 0), ("p", -1, 0), ("p", 0, 2**63), ("p", True, 0), ("p", 0), "p"],
)
def test_a_malformed_producer_is_refused_before_the_database(bad) -> None:
    stream = pgstreams.create_stream()
    with pytest.raises((TypeError, ValueError)):
        pgstreams.write(stream, "x", producer=bad)
    assert _stored(stream) == []


@pytest.mark.faults
def test_a_producers_writes_retried_through_a_server_restart_are_stored_once(spawn) -> None:
    """A process writes 300 chunks as one producer while the server restarts, retrying each
    write that fails with the same (id, epoch, seq): whether or not a failed write had committed,
    the stream holds each chunk once, in order."""
    server = ServerControl(connection.settings_dict)
    if server.why_not:
        pytest.skip(server.why_not)
    stream = pgstreams.create_stream()
    worker = spawn("retrying", "--stream", str(stream.id), "--count", "300", "--pause", "0.01", "--producer")

    def restart() -> None:
        time.sleep(0.8)
        server.stop()
        time.sleep(1.0)
        server.start()

    thread = threading.Thread(target=restart)
    thread.start()
    lines = [json.loads(line) for line in worker.stdout]  # bounded: the worker ends after 300 writes
    thread.join(120)
    _forget_dead_connections()
    assert worker.wait(60) == 0, worker.stderr.read()
    summary = lines[-1]
    print(f"{len(summary['errors'])} failed write(s) retried, {summary['duplicates']} recognised as already stored")
    assert summary["errors"], "the restart interrupted no write"
    assert _stored(stream) == [f"r{i}" for i in range(300)]
