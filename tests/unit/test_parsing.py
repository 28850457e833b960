"""What clients and operators type, parsed: offsets in a WebSocket or SSE request, the ages and
dates ``pgstreams_prune`` takes, and a chunk of an application/json stream."""

from __future__ import annotations

import datetime
import json

import pytest
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from pgstreams import contents, maintenance, protocol


@pytest.mark.parametrize(
    ("values", "expected"), [(None, 0), ([], 0), (["0"], 0), (["42"], 42), (["9" * 18], 10**18 - 1)]
)
def test_an_offset_is_one_non_negative_integer_that_fits_a_bigint(values, expected) -> None:
    assert protocol.parse_offset(values, "from") == expected


@pytest.mark.parametrize("values", [["-1"], ["abc"], ["1.5"], [""], ["1", "2"], ["9" * 19], [" 1"]])
def test_anything_else_is_a_value_error_that_names_the_parameter(values) -> None:
    with pytest.raises(ValueError, match="'from'"):
        protocol.parse_offset(values, "from")


def test_parse_cutoff() -> None:
    now = timezone.now()
    assert maintenance.parse_cutoff("7d", now) == now - datetime.timedelta(days=7)
    assert maintenance.parse_cutoff("12h", now) == now - datetime.timedelta(hours=12)
    assert maintenance.parse_cutoff("2026-01-02").isoformat() == "2026-01-02T00:00:00+00:00"
    with pytest.raises(ValueError, match="neither an age"):
        maintenance.parse_cutoff("soon")


@pytest.mark.parametrize("value", ["99999999999d", "999999999d", "9999999999999999999999w", "9" * 5000 + "s"])
def test_an_age_before_the_year_1_is_a_value_error_that_says_the_largest_accepted(value: str) -> None:
    """It was an OverflowError (or int()'s digit limit) for any caller of parse_cutoff."""
    now = timezone.now()
    with pytest.raises(ValueError, match="the largest age accepted is") as refused:
        maintenance.parse_cutoff(value, now)
    largest = str(refused.value).split("the largest age accepted is ")[1].split(";")[0]
    maintenance.parse_cutoff(largest, now)  # accepted, as said


def test_a_cutoff_is_in_utc_and_one_outside_its_years_is_a_value_error() -> None:
    assert maintenance.parse_cutoff("2026-01-02T00:00+20:00").isoformat() == "2026-01-01T04:00:00+00:00"
    with pytest.raises(ValueError, match="outside the years 1 to 9999 in UTC"):
        maintenance.parse_cutoff("9999-12-31T23:00-01:00")


def _answer(parse, text: str) -> str:
    try:
        parse(text)
        return "ok"
    except (ValueError, RecursionError) as exc:
        return f"{type(exc).__name__}: {exc}"


_JSONISH = st.text(alphabet=' \t\n{}[]":,.-+eE0123456789natrufslINfiy\\u', max_size=40)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


@given(st.one_of(_JSONISH, st.text(max_size=40), _VALUES.map(json.dumps), _VALUES.map(lambda v: f" {json.dumps(v)}\n")))
def test_a_json_chunk_is_judged_as_the_strict_decoder_judges_it(text: str) -> None:
    """The append path's check of a chunk of an application/json stream (its decoder's scanner
    first) accepts and refuses what the strict decoder does, with the same error."""
    assert _answer(contents._one_value, text) == _answer(contents.STRICT_JSON.decode, text)
