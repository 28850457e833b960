"""A stateful property test: random interleavings of writes, rolled-back writes, batches, writes
whose notification is lost, closes, and readers started at random offsets and advanced at random
times. Every reader must yield exactly the committed sequence from its offset, and end at the close."""

from __future__ import annotations

import time

import pytest
from django.db import transaction
from django.test import override_settings
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

import pgstreams
from pgstreams import listener
from tests.helpers import Rollback

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.faults]

chunk_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)


class StreamMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.stream = pgstreams.create_stream()
        self.committed: list[str] = []
        self.closed = False
        self.readers: list[tuple[int, object, list[str]]] = []  # (from, iterator, received)

    @precondition(lambda self: not self.closed)
    @rule(data=chunk_text)
    def write(self, data: str) -> None:
        assert pgstreams.write(self.stream.id, data) == len(self.committed)
        self.committed.append(data)

    @precondition(lambda self: not self.closed)
    @rule(data=chunk_text)
    def write_lost_notification(self, data: str) -> None:
        """A write nobody is told about. Readers first take everything before it and wait at the
        end; earlier notifications are let land; then only the poll can bring them this chunk."""
        for start, reader, received in self.readers:
            while start + len(received) < len(self.committed):
                received.append(next(reader).data)
        time.sleep(0.03)
        with override_settings(PGSTREAMS={"NOTIFY_MODE": "off", "POLL_INTERVAL": 0.05}):
            assert pgstreams.write(self.stream.id, data) == len(self.committed)
        self.committed.append(data)
        for _, reader, received in self.readers:
            received.append(next(reader).data)

    @precondition(lambda self: not self.closed)
    @rule(data=chunk_text)
    def write_rolled_back(self, data: str) -> None:
        with pytest.raises(Rollback), transaction.atomic():
            pgstreams.write(self.stream.id, data)
            raise Rollback

    @precondition(lambda self: not self.closed)
    @rule(items=st.lists(chunk_text, max_size=5))
    def write_many(self, items: list[str]) -> None:
        offsets = pgstreams.write_many(self.stream.id, items)
        assert offsets == list(range(len(self.committed), len(self.committed) + len(items)))
        self.committed.extend(items)

    @rule()
    def close(self) -> None:
        if self.closed:
            with pytest.raises(pgstreams.StreamClosed):
                pgstreams.close(self.stream.id)
        else:
            assert pgstreams.close(self.stream.id) == len(self.committed)
            self.closed = True

    @rule(where=st.integers(min_value=0, max_value=40))
    def start_reader(self, where: int) -> None:
        start = min(where, len(self.committed))
        self.readers.append((start, pgstreams.read(self.stream.id, from_offset=start, timeout=10), []))

    @precondition(lambda self: self.readers)
    @rule(which=st.integers(min_value=0), steps=st.integers(min_value=1, max_value=40))
    def advance_reader(self, which: int, steps: int) -> None:
        start, reader, received = self.readers[which % len(self.readers)]
        for _ in range(min(steps, len(self.committed) - start - len(received))):
            received.append(next(reader).data)  # a committed chunk it has not had: must come

    @invariant()
    def readers_have_a_prefix_of_the_truth(self) -> None:
        for start, _, received in self.readers:
            assert received == self.committed[start : start + len(received)]

    def teardown(self) -> None:
        if not self.closed:
            pgstreams.close(self.stream.id)
        for start, reader, received in self.readers:
            received.extend(chunk.data for chunk in reader)  # to the end: the close
            assert received == self.committed[start:]


@pytest.mark.usefixtures("fresh_listener")
def test_every_reader_yields_exactly_the_committed_sequence() -> None:
    with override_settings(PGSTREAMS={"POLL_INTERVAL": 0.05}):
        run_state_machine_as_test(
            StreamMachine,
            settings=settings(
                max_examples=25,
                stateful_step_count=30,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    assert listener.get_listener().stats.restarts == 0
