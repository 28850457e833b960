"""Notification payloads: packing under Postgres' limit, decoding, foreign entries skipped."""

from __future__ import annotations

import uuid

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
