"""Notification payloads: packing under Postgres' limit, decoding, foreign entries skipped."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgstreams import notify
from pgstreams.types import Mark


def test_pack_fills_payloads_up_to_the_limit_and_round_trips() -> None:
    marks = [Mark(uuid.uuid4(), i * 1_000_003, i % 3 == 0) for i in range(500)]
    payloads = notify.pack(marks)
    assert len(payloads) > 1
    assert all(len(p.encode()) <= notify.PAYLOAD_LIMIT for p in payloads)
    # As few payloads as fit: every payload but the last is too full for one more entry.
    assert all(len(p) + 1 + 48 > notify.PAYLOAD_LIMIT for p in payloads[:-1])
    assert [m for p in payloads for m in notify.decode(p)] == marks


def test_decode_skips_foreign_entries() -> None:
    good = Mark(uuid.uuid4(), 7, False)
    assert list(notify.decode(f"hello,{notify.encode(good)},x:y,{uuid.uuid4().hex}")) == [good]


@given(st.text(alphabet="0123456789:c+- _x", max_size=12))
def test_what_an_entry_says_after_its_id_is_its_first_part_as_a_number_and_closed_by_a_lone_c_after_it(state) -> None:
    """The listener parses the part after a followed stream's id and colon with ``decode_state``
    (no list, no Mark): it reads what the first parser read, the text up to the next colon as the
    offset and "closed" for exactly one more part, "c"; and refuses what it refused."""
    parts = state.split(":")
    try:
        expected = (int(parts[0]), parts[1:] == ["c"])
    except ValueError:
        with pytest.raises(ValueError):
            notify.decode_state(state)
        return
    assert notify.decode_state(state) == expected
