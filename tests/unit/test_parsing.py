"""What clients and operators type, parsed: offsets in a WebSocket or SSE request, and the ages
and dates ``pgstreams_prune`` takes."""

from __future__ import annotations

import datetime

import pytest
from django.utils import timezone

from pgstreams import maintenance, protocol


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
