"""The guard's judgement of what its looks found (guard.py), without a database."""

from __future__ import annotations

import logging
import time

from django.test import override_settings

from pgstreams import guard


def test_a_look_that_ended_a_session_says_which_and_counts_it(caplog) -> None:
    look = guard.Guard()
    ended = guard.metrics.stuck_listeners_ended._value.get()
    with caplog.at_level(logging.WARNING, "pgstreams.guard"):
        look.ended(0.2, [(4321, "pgstreams listener 99", "10.0.0.7", 16.0, True), (4322, "x", "local", 9.0, False)])
    assert guard.metrics.stuck_listeners_ended._value.get() == ended + 1  # the one it ended, not the gone one
    assert [r.getMessage() for r in caplog.records if "4321" in r.getMessage() and "10.0.0.7" in r.getMessage()]
    assert not [r for r in caplog.records if "4322" in r.getMessage()]


@override_settings(PGSTREAMS={"LISTEN_CHECK_INTERVAL": 0.01})
def test_a_growing_queue_no_look_can_explain_is_reported_once_in_five_minutes(caplog) -> None:
    look = guard.Guard()
    with caplog.at_level(logging.WARNING, "pgstreams.guard"):
        look.ended(0.5, [])
        time.sleep(0.07)  # past twice the 0.03 s a listener takes to count as stuck
        look.ended(0.5, [])  # not growing: a small queue's usual lag, not a session holding it
        assert not caplog.records
        look.ended(0.6, [])
        look.ended(0.7, [])
    assert len(caplog.records) == 1 and "another application's session" in caplog.records[0].getMessage()
