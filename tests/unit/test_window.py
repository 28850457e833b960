"""The listener's window arithmetic (window.py) and how a fetch's rows become pages (fetch.py):
pure functions, no database."""

from __future__ import annotations

import datetime
import uuid

from pgstreams import window
from pgstreams.fetch import pages_from_rows
from pgstreams.types import StreamChunk
from pgstreams.window import Page, Tail

SID = uuid.uuid4()
BUDGET = 16384  # WINDOW_BYTES' default
AT = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def page(start: int, stop: int, next_offset: int | None = None, closed: bool = False, size: int = 1) -> Page:
    return Page(
        exists=True,
        next_offset=stop if next_offset is None else next_offset,
        closed=closed,
        values=["x" * size] * (stop - start),
        times=[AT] * (stop - start),
    )


def offsets(tail: Tail) -> list[int]:
    """The window's offsets, as a reader takes them from its start (checking the two lists agree)."""
    assert len(tail.values) == len(tail.times) == tail.end - (tail.start or 0)
    return [c.offset for c in tail.batch(0, 2**62)] if tail.values else []


def test_a_first_page_starts_the_window_where_it_was_asked_for() -> None:
    tail = Tail(SID)
    assert tail.merge(5, page(5, 9), BUDGET)
    assert (tail.start, tail.end, offsets(tail)) == (5, 9, [5, 6, 7, 8])


def test_an_empty_first_page_at_the_end_starts_an_empty_window_there() -> None:
    tail = Tail(SID)
    assert tail.merge(3, Page(exists=True, next_offset=3), BUDGET)
    assert (tail.start, tail.end, offsets(tail)) == (3, 3, [])


def test_a_page_from_the_windows_end_extends_it_and_overlaps_are_not_repeated() -> None:
    tail = Tail(SID)
    tail.merge(0, page(0, 4), BUDGET)
    assert tail.merge(2, page(2, 7), BUDGET)  # overlaps 2..3
    assert offsets(tail) == list(range(7)) and tail.end == 7


def test_a_page_that_does_not_reach_the_windows_end_changes_nothing() -> None:
    tail = Tail(SID)
    tail.merge(10, page(10, 12), BUDGET)
    assert not tail.merge(0, page(0, 5), BUDGET)  # behind: a reader's own page, not the tail's
    assert not tail.merge(20, page(20, 22), BUDGET)  # past the end: would leave a hole
    assert offsets(tail) == [10, 11]


def test_the_window_is_trimmed_to_its_byte_budget_from_the_front_but_keeps_the_last_page() -> None:
    per_chunk = window.size("x")
    fits = 10 * per_chunk
    tail = Tail(SID)
    tail.merge(0, page(0, 8), fits)
    tail.merge(8, page(8, 13), fits)
    assert offsets(tail) == list(range(3, 13)) and tail.window_bytes == fits
    big = Tail(SID)  # one page over the budget stays whole
    big.merge(0, page(0, 3, size=fits), fits)
    assert offsets(big) == [0, 1, 2]
    big.merge(3, page(3, 4, size=1), fits)
    assert offsets(big) == [3] and big.window_bytes == per_chunk


def test_a_closed_page_fixes_the_end_once() -> None:
    tail = Tail(SID)
    assert tail.merge(0, page(0, 2, closed=True), BUDGET)
    assert tail.final == 2
    assert not tail.merge(2, Page(exists=True, next_offset=2, closed=True), BUDGET)


def test_announcements_past_the_window_want_a_fetch() -> None:
    tail = Tail(SID)
    tail.merge(0, page(0, 2), BUDGET)
    assert not tail.wants_fetch()
    tail.hint = 5
    assert tail.wants_fetch()
    tail.hint, tail.close_hinted = 2, True
    assert tail.wants_fetch()  # closed, but the end is not known yet


def test_chunks_pruned_after_the_window_reset_it() -> None:
    tail = Tail(SID)
    tail.merge(0, page(0, 3), BUDGET)
    assert tail.merge(3, Page(exists=True, next_offset=9, pruned_to=6), BUDGET)
    assert (tail.start, tail.end, tail.values, tail.times) == (None, 0, [], [])
    other = Tail(SID)
    other.merge(0, page(0, 3), BUDGET)
    assert not other.merge(1, Page(exists=True, next_offset=9, pruned_to=6), BUDGET)  # a reader's page, not the tail's
    assert offsets(other) == [0, 1, 2]


def rows(key_index: int, next_offset: int | None, closed: bool, offsets: list[int]) -> list[tuple]:
    if not offsets:
        return [(key_index, next_offset, closed, None, None, None, None, None)]
    return [(key_index, next_offset, closed, o, f"c{o}", None, AT, None) for o in offsets]


def test_rows_become_pages_of_consecutive_chunks() -> None:
    keys = [(SID, 0), (SID, 10)]
    pages = pages_from_rows(keys, rows(1, 12, False, [0, 1, 2]) + rows(2, 12, False, [10, 11]))
    assert [c.offset for c in pages[(SID, 0)].chunks(SID, 0)] == [0, 1, 2]
    assert [c.data for c in pages[(SID, 10)].chunks(SID, 10)] == ["c10", "c11"]
    assert pages[(SID, 0)].pruned_to is None and pages[(SID, 0)].next_offset == 12


def test_a_page_stops_at_a_gap_and_a_missing_first_chunk_says_where_to_resume() -> None:
    keys = [(SID, 0), (SID, 5), (SID, 3)]
    pages = pages_from_rows(
        keys, rows(1, 20, False, [0, 1, 2, 7, 8]) + rows(2, 20, False, [7, 8]) + rows(3, 20, False, [])
    )
    assert [c.offset for c in pages[(SID, 0)].chunks(SID, 0)] == [0, 1, 2]  # never 7 under offset 3
    assert pages[(SID, 5)].chunks(SID, 5) == [] and pages[(SID, 5)].pruned_to == 7
    assert pages[(SID, 3)].pruned_to == 20  # nothing left after 3: resume at the end


def test_an_unknown_stream_is_a_page_that_does_not_exist() -> None:
    pages = pages_from_rows([(SID, 0)], rows(1, None, False, []))
    assert not pages[(SID, 0)].exists


def test_a_batch_from_the_window_ends_with_the_chunk_that_reaches_a_page_of_data() -> None:
    """A window is about a page unless WINDOW_BYTES is set larger: a reader's batch stays about a
    page anyway (an SSE response sends its last batch whole)."""
    tail = Tail(SID)
    tail.merge(0, page(0, 40, size=1000), 1 << 20)  # a window of 40 kB, under a budget of 1 MiB
    assert [c.offset for c in tail.batch(0, 1 << 20)] == list(range(40))  # under the page: all of it
    assert [c.offset for c in tail.batch(5, 2500)] == [5, 6, 7]  # the third reaches 2,500
    assert [c.offset for c in tail.batch(39, 10)] == [39]  # one at least


def test_a_readers_chunks_carry_their_own_data_and_time_after_the_window_is_trimmed_and_moved() -> None:
    def distinct(start: int, stop: int) -> Page:
        offsets = range(start, stop)
        return Page(
            exists=True,
            next_offset=stop,
            values=[f"c{o}" for o in offsets],
            times=[AT + datetime.timedelta(seconds=o) for o in offsets],
        )

    def right(chunk: StreamChunk) -> bool:
        return chunk.data == f"c{chunk.offset}" and chunk.created_at == AT + datetime.timedelta(seconds=chunk.offset)

    tail = Tail(SID)
    budget = 10 * window.size("c10")
    tail.merge(0, distinct(0, 8), budget)
    tail.merge(6, distinct(6, 15), budget)  # overlaps 6..7, and trims the front
    assert tail.start == 5 and all(right(c) for c in tail.batch(0, 2**62)) and tail.batch(3, 2**62)[0].offset == 8
    full = distinct(15, 20)
    full.next_offset = 40  # a full page: more is there
    tail.merge(15, full, budget)
    assert tail.jump(35) and (tail.start, tail.end, tail.values, tail.times) == (35, 35, [], [])
    assert tail.merge(35, distinct(35, 37), budget)
    assert [(c.offset, right(c)) for c in tail.batch(0, 2**62)] == [(35, True), (36, True)]


def test_a_run_becomes_its_chunks_from_the_pages_offset_and_a_gap_before_it_says_where_to_resume() -> None:
    from pgstreams import runs

    value, run, at = runs.pack([f"c{o}" for o in range(3, 8)], [AT] * 5)  # offsets 3 to 7 in one row
    row = (value, None, at, run)
    keys = [(SID, 5), (SID, 0), (SID, 3)]
    pages = pages_from_rows(
        keys,
        [(1, 9, True, 7, *row), (1, 9, True, 8, "c8", None, AT, None)]
        + [(2, 9, True, 7, *row)]
        + [(3, 9, True, 7, *row), (3, 9, True, 9, "c9", None, AT, None)],
    )
    assert [(c.offset, c.data) for c in pages[(SID, 5)].chunks(SID, 5)] == [(5, "c5"), (6, "c6"), (7, "c7"), (8, "c8")]
    assert pages[(SID, 0)].chunks(SID, 0) == [] and pages[(SID, 0)].pruned_to == 3
    assert [c.offset for c in pages[(SID, 3)].chunks(SID, 3)] == [3, 4, 5, 6, 7]  # and not 9, past a gap
