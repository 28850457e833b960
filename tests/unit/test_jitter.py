"""pgstreams' random waits (reconnect backoff, cursors, and the listener's and appender's jitter)
draw from generators of their own, leaving the global state a project (or Hypothesis) seeds alone."""

from __future__ import annotations

import random

from pgstreams import db
from pgstreams.durable import wire


def test_backoff_and_cursors_leave_the_global_random_state_alone() -> None:
    random.seed(37)
    before = random.getstate()
    backoff = db.Backoff()
    delays = [backoff.next() for _ in range(5)]
    cursors = [wire.cursor(str(10**12)) for _ in range(5)]
    assert random.getstate() == before
    assert all(0 < d <= 2.0 for d in delays) and all(int(c) > 10**12 for c in cursors)
