"""A run (compaction's row of many chunks) gives back every chunk it was made of, value and time,
whatever their text, sizes and times."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgstreams import runs

UTC = datetime.UTC
moments = st.datetimes(
    min_value=datetime.datetime(1990, 1, 1), max_value=datetime.datetime(2200, 1, 1), timezones=st.just(UTC)
)


@given(st.lists(st.tuples(st.text(max_size=40), moments), min_size=1, max_size=60))
def test_a_run_of_text_gives_back_each_chunk_and_its_time(chunks: list[tuple[str, datetime.datetime]]) -> None:
    values, times = [v for v, _ in chunks], [t for _, t in chunks]
    value, run, created_at = runs.pack(values, times)
    assert created_at == times[-1] and runs.count(run) == len(values)
    got_values, got_times = runs.unpack(value, run, created_at)
    assert got_values == values and got_times == times
    assert [t.isoformat() for t in got_times] == [t.isoformat() for t in times]


@given(st.lists(st.tuples(st.binary(max_size=70_000), moments), min_size=1, max_size=4))
def test_a_run_of_bytes_gives_back_each_chunk_however_large(chunks: list[tuple[bytes, datetime.datetime]]) -> None:
    values, times = [v for v, _ in chunks], [t for _, t in chunks]
    value, run, created_at = runs.pack(values, times)
    assert runs.unpack(value, run, created_at) == (values, times)


def test_the_index_takes_the_narrowest_types_that_hold_it() -> None:
    now = datetime.datetime(2026, 12, 7, tzinfo=UTC)
    times = [now - datetime.timedelta(milliseconds=20 * (9 - i)) for i in range(10)]
    _, run, _ = runs.pack([" the"] * 10, times)
    assert len(run) == 7 + 10 * 2 + 10 * 4  # head, uint16 lengths, int32 microseconds
    _, run, _ = runs.pack([" the", "x" * 70_000], [now - datetime.timedelta(days=1), now])
    assert run[1:3] == b"Iq" and len(run) == 7 + 2 * 4 + 2 * 8


@pytest.mark.parametrize(
    ("values", "times", "message"),
    [
        ([], [], "at least one chunk"),
        (["a", b"b"], [datetime.datetime(2026, 1, 1, tzinfo=UTC)] * 2, "all text or all bytes"),
        (["a"], [], "at least one chunk"),
    ],
)
def test_a_run_that_cannot_be_made_says_why(values: list, times: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        runs.pack(values, times)


def test_an_index_that_does_not_match_its_data_is_refused() -> None:
    now = datetime.datetime(2026, 12, 7, tzinfo=UTC)
    value, run, created_at = runs.pack(["ab", "c"], [now, now])
    with pytest.raises(runs.BadRun, match="does not match"):
        runs.unpack(value + "d", run, created_at)
    with pytest.raises(runs.BadRun, match="^a run of format 2, which"):
        runs.unpack(value, b"\x02" + run[1:], created_at)
    for cut in (run[:3], run[:-1]):  # its head cut short; its index's last item cut short
        with pytest.raises(runs.BadRun, match="unreadable"):
            runs.unpack(value, cut, created_at)
    with pytest.raises(runs.BadRun, match="unreadable"):
        runs.count(run[:3])


def test_times_in_a_zone_with_daylight_saving_come_back_as_they_were_across_its_change() -> None:
    """A connection in such a zone gives times of one tzinfo: they subtract as wall-clock times,
    an hour off across the change, unless counted in UTC."""
    from zoneinfo import ZoneInfo

    new_york = ZoneInfo("America/New_York")
    start = datetime.datetime(2026, 11, 1, 5, 30, tzinfo=UTC)  # 01:30 EDT: the change is at 06:00 UTC
    times = [(start + datetime.timedelta(minutes=i)).astimezone(new_york) for i in range(60)]
    value, run, created_at = runs.pack([f"d{i}" for i in range(60)], times)
    got = runs.unpack(value, run, created_at)[1]
    assert [t.astimezone(UTC) for t in got] == [t.astimezone(UTC) for t in times]
    assert [t.isoformat() for t in got] == [t.isoformat() for t in times]
