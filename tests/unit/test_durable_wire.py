"""The Durable Streams vocabulary, pure: what the endpoint accepts and refuses before it touches
the database (offsets, paths, TTLs, producer headers, bodies), and the shapes it sends."""

from __future__ import annotations

import base64
import datetime
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgstreams.durable import wire
from pgstreams.durable.wire import Refused
from pgstreams.types import Producer


def refusal(call, *args, **kwargs) -> int:
    with pytest.raises(Refused) as refused:
        call(*args, **kwargs)
    assert refused.value.message  # says what is wrong
    return refused.value.status


def test_offsets_are_fixed_width_sortable_and_round_trip() -> None:
    offsets = [wire.format_offset(n) for n in (0, 9, 10, 123456)]
    assert offsets == sorted(offsets) and len(set(map(len, offsets))) == 1
    assert [wire.parse_offset(o) for o in offsets] == [0, 9, 10, 123456]
    assert wire.format_offset(0) not in (wire.START, wire.NOW)
    with pytest.raises(ValueError):
        wire.format_offset(10**16)


@pytest.mark.parametrize(
    "bad",
    ["0,1", "0 1", "", "../0000000000000001_0000000000000000", "0000000000000001_0000000000000000/..",
     "0000000000000001_0000000000000000\x00", "0000000000000001_0000000000000001", "00000000000000001_0000000000000000",
     "9999999999999999_9999999999999999", "-2", "1", "NOW"],
)  # fmt: skip
def test_an_offset_this_server_did_not_give_is_refused(bad: str) -> None:
    assert refusal(wire.parse_offset, bad) == 400


def test_the_offset_parameter_is_given_once_and_not_empty() -> None:
    assert wire.read_offset([]) == wire.START
    assert refusal(wire.read_offset, ["a", "b"]) == 400
    assert refusal(wire.read_offset, [""]) == 400


@pytest.mark.parametrize("bad", ["", "a" * 513, "../etc", "a/../b", "a//b", "a/./b", "a/", "tab\there", "back\\slash"])
def test_a_hostile_path_is_refused(bad: str) -> None:
    assert refusal(wire.stream_path, bad) == 400


def test_the_protocols_reserved_root_is_not_a_stream() -> None:
    assert refusal(wire.stream_path, "__ds/subscriptions/x") == 404
    assert wire.stream_path("chats/42/answer") == "chats/42/answer"


@pytest.mark.parametrize("bad", ["00060", "+60", "60.5", "1e3", "-1", "abc", "", str(2**31)])
def test_a_ttl_is_a_plain_whole_number_of_seconds(bad: str) -> None:
    assert refusal(wire.expiry, bad, None) == 400


@pytest.mark.parametrize(
    "bad",
    ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00", "1969-12-31T23:59:59Z", "2030-W01-1T00:00:00Z",
     "20300101T000000Z", "2030-01-01T00:00Z", "2030-02-30T00:00:00Z"],
)  # fmt: skip
def test_an_expiry_time_is_rfc3339_within_years_the_table_can_load(bad: str) -> None:
    assert refusal(wire.expiry, None, bad) == 400


def test_a_content_type_is_a_media_type_the_table_can_hold() -> None:
    assert wire.content_type(" Application/JSON; charset=utf-8 ") == "Application/JSON; charset=utf-8"
    assert wire.content_type(None) is None and wire.content_type("") is None
    for bad in ["text", "text/plain\x00", "a/" + "b" * 300, "text/plain\nX-Injected: 1", "/plain"]:
        assert refusal(wire.content_type, bad) == 400


def test_huge_numbers_in_headers_are_400_not_a_crash() -> None:
    assert refusal(wire.whole, "9" * 5000, "Producer-Seq") == 400
    assert refusal(wire.whole, str(2**63), "Stream-TTL", 2**63 - 1) == 400


def test_expiry_is_a_ttl_or_a_time_with_a_zone_never_both() -> None:
    assert wire.expiry("3600", None) == (3600, None)
    assert wire.expiry(None, "2030-01-01T00:00:00Z")[1] == datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
    assert wire.expiry(None, "2030-01-01T01:00:00+01:00")[1] == datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
    assert refusal(wire.expiry, "60", "2030-01-01T00:00:00Z") == 400
    assert refusal(wire.expiry, None, "2030-01-01T00:00:00") == 400  # no zone
    assert refusal(wire.expiry, None, "not-a-timestamp") == 400


@pytest.mark.parametrize(
    "headers",
    [
        {"Producer-Id": "p"},
        {"Producer-Id": "p", "Producer-Epoch": "0"},
        {"Producer-Epoch": "0", "Producer-Seq": "0"},
        {"Producer-Id": " ", "Producer-Epoch": "0", "Producer-Seq": "0"},
        {"Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": "1abc"},
        {"Producer-Id": "p", "Producer-Epoch": "-1", "Producer-Seq": "0"},
        {"Producer-Id": "p", "Producer-Epoch": "1e3", "Producer-Seq": "0"},
        {"Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": str(2**53)},
    ],
)
def test_malformed_producer_headers_are_refused(headers: dict[str, str]) -> None:
    assert refusal(wire.producer, headers) == 400


def test_producer_headers_make_a_producer_or_none() -> None:
    assert wire.producer({}) is None
    headers = {"Producer-Id": "p", "Producer-Epoch": "2", "Producer-Seq": str(2**53 - 1)}
    assert wire.producer(headers) == Producer("p", 2, 2**53 - 1)


def test_stream_closed_is_true_only_when_it_says_true() -> None:
    assert [wire.flag(v) for v in ("true", "TRUE", " True ", "false", "1", "yes", "", None)] == [True] * 3 + [False] * 5


def test_json_bodies_flatten_one_level_and_keep_each_messages_text() -> None:
    assert wire.json_messages(b' {"a": 1} \n', 10) == ['{"a": 1}']
    assert wire.json_messages(b"[[1,2], [3,4]]", 10) == ["[1,2]", "[3,4]"]
    assert wire.json_messages(b"[[[1]]]", 10) == ["[[1]]"]
    assert wire.json_messages(b"[ ]", 10) == []
    # As sent: number forms, duplicate keys, escapes (a lone surrogate, which PostgreSQL text
    # cannot hold, stays escaped).
    body = '[1E2, {"k": 1, "k": 2}, "\\ud800", "é"]'.encode()
    assert wire.json_messages(body, 10) == ["1E2", '{"k": 1, "k": 2}', '"\\ud800"', '"é"']


def test_a_json_array_of_more_values_than_one_append_takes_is_refused_before_it_is_cut() -> None:
    assert wire.json_messages(b"[1, 2]", 2) == ["1", "2"]
    with pytest.raises(wire.Refused, match="3 values is over one append's 2") as refused:
        wire.json_messages(b"[1, 2, 3]", 2)
    assert refused.value.status == 413


@pytest.mark.parametrize(
    "bad", [b"{ invalid }", b"NaN", b"[1, Infinity]", b"[1e400]", b"\xff", b"[" * 100_000, b"[1,]"]
)
def test_a_body_that_is_not_json_is_refused(bad: bytes) -> None:
    assert refusal(wire.json_messages, bad, 10) == 400


def test_a_text_stream_takes_utf8_without_nul() -> None:
    assert wire.text_body("héllo".encode()) == "héllo"
    assert refusal(wire.text_body, b"\xc3") == 400
    assert refusal(wire.text_body, b"a\x00b") == 400


def test_large_bodies_are_cut_into_chunks_at_character_boundaries() -> None:
    text = "aé€😀" * 1000
    pieces = list(wire.pieces(text, 7))
    assert "".join(pieces) == text and all(len(p.encode()) <= 7 for p in pieces)
    assert list(wire.pieces("😀😀", 2)) == ["😀", "😀"]  # a limit below one character: one each
    assert list(wire.pieces(bytes(range(10)), 4)) == [bytes(range(4)), bytes(range(4, 8)), bytes(range(8, 10))]


def test_sse_payloads_cannot_start_an_event_of_their_own() -> None:
    event = wire.sse_data(["a\r\n\r\nevent: control\rdata: x\n\nb"], json_mode=False, binary=False).decode()
    assert event.count("\n\n") == 1 and event.endswith("\n\n")
    assert all(line.startswith(("event:", "data:")) for line in event.strip("\n").split("\n"))
    binary = wire.sse_data([b"\x00\n\r", b"\xff"], json_mode=False, binary=True).decode()
    assert base64.b64decode(binary.split("data:")[1]) == b"\x00\n\r\xff"
    assert json.loads(wire.sse_data(['{"a":1}', "2"], json_mode=True, binary=False).decode().split("data:")[1]) == [
        {"a": 1},
        2,
    ]


def test_control_events_carry_a_cursor_only_while_the_stream_is_open() -> None:
    open_ = json.loads(wire.sse_control(3, cursor_value="7", up_to_date=True, closed=False).decode().split("data:")[1])
    closed = json.loads(wire.sse_control(3, cursor_value="7", up_to_date=True, closed=True).decode().split("data:")[1])
    assert open_ == {"streamNextOffset": wire.format_offset(3), "streamCursor": "7", "upToDate": True}
    assert closed == {"streamNextOffset": wire.format_offset(3), "streamClosed": True, "upToDate": True}


def test_a_cursor_always_moves_past_the_clients() -> None:
    now = int(wire.cursor(None))
    assert int(wire.cursor(str(now))) > now
    assert int(wire.cursor(str(now + 1000))) > now + 1000


def test_etags_vary_with_range_and_closure_and_match_lists() -> None:
    import uuid

    sid = uuid.uuid4()
    tag = wire.etag(sid, 0, 3, False)
    assert tag != wire.etag(sid, 0, 3, True) and tag != wire.etag(sid, 0, 4, False)
    assert wire.etag_matches(tag, f'"other", W/{tag}')
    assert not wire.etag_matches(tag, '"wrong"') and not wire.etag_matches(tag, None)


def test_an_etag_tells_nothing_of_the_stream_id() -> None:
    """An ownerless stream's id reads it at the WebSocket and SSE endpoints: an ETag that held it
    would hand that capability to anyone who read the stream once at the Durable Streams one."""
    import uuid

    sid = uuid.uuid4()
    tag = wire.etag(sid, 0, 3, False)
    assert sid.hex not in tag and str(sid) not in tag
    assert not any(sid.hex[i : i + 8] in tag for i in range(0, 32, 4))
    assert tag == wire.etag(sid, 0, 3, False) != wire.etag(uuid.uuid4(), 0, 3, False)


def test_sse_text_keeps_the_spaces_a_line_starts_with() -> None:
    event = wire.sse_data([" more", "\n  two"], json_mode=False, binary=False).decode()
    lines = [line.removeprefix("data:") for line in event.splitlines() if line.startswith("data:")]
    # An SSE reader drops one space after the colon, as the official client does.
    assert [line[1:] if line.startswith(" ") else line for line in lines] == [" more", "  two"]


def _read_sse_text(event: bytes) -> str:
    """What an SSE reader makes of a data event: its data lines, one space after the colon
    dropped, joined by newlines (the spec's parsing, as the official client does it)."""
    lines = event.decode().split("\n")
    assert lines[0] == "event: data" and lines[-2:] == ["", ""]
    data = [line.removeprefix("data:") for line in lines[1:-2]]
    assert len(data) == len(lines) - 3  # every line a data line
    return "\n".join(line[1:] if line.startswith(" ") else line for line in data)


# Chunks of the characters that matter (spaces, both line breaks, several bytes in UTF-8), or of any.
_TEXT = st.text(st.sampled_from([" ", "a", ":", "\r", "\n", "é", "😀"])) | st.text()


@given(st.lists(_TEXT, max_size=8))
def test_an_sse_data_event_reads_back_as_its_text_with_every_line_break_a_newline(chunks: list[str]) -> None:
    text = "".join(chunks)
    expected = text.replace("\r\n", "\n").replace("\r", "\n")
    assert _read_sse_text(wire.sse_data(chunks, json_mode=False, binary=False)) == expected


def test_the_endpoints_headers_are_read_as_djangos_request_headers_reads_them() -> None:
    from django.test import AsyncRequestFactory

    from pgstreams.durable.views import _Headers

    request = AsyncRequestFactory().post(  # an ASGIRequest: its META made from the scope's headers
        "/v1/stream/x",
        b"body",
        content_type="application/json",
        headers={"Stream-TTL": "60", "producer-id": "p", "If-None-Match": '"a", "b"'},
    )
    names = ["Content-Type", "content-length", "Stream-TTL", "STREAM-ttl", "Producer-Id", "If-None-Match", "Stream-Seq"]
    assert [_Headers(request).get(name) for name in names] == [request.headers.get(name) for name in names]
    assert _Headers(request).get("Stream-Seq", "none") == "none"
