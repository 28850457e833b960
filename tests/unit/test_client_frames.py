"""``protocol.client_ack``, the WebSocket consumer's parser of a client's frames, over arbitrary
text and hostile JSON (hypothesis): it answers a frame id or a ValueError that says what is
wrong, never anything else (json's RecursionError on deep nesting got through, and crashed the
consumer)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgstreams.protocol import client_ack

MAX = 1024

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
deep = st.builds(
    lambda opener, depth, tail: opener * depth + tail,
    st.sampled_from(["[", '{"a":', '{"type":"ack","frame":[', "[{}"]),
    st.integers(0, 3000),
    st.text(max_size=5),
)


def refused_or_id(text: str) -> str | None:
    try:
        frame = client_ack(text, MAX)
    except ValueError as exc:
        assert str(exc)  # says what is wrong
        return None
    assert isinstance(frame, str)
    return frame


@given(st.text())
def test_any_text_is_an_id_or_a_clear_refusal(text: str) -> None:
    refused_or_id(text)


@given(deep)
def test_deep_nesting_is_refused_whatever_its_depth(text: str) -> None:
    assert refused_or_id(text) is None


@given(json_values)
def test_any_json_but_an_ack_is_refused(value: object) -> None:
    frame = refused_or_id(json.dumps(value))
    assert frame is None or (isinstance(value, dict) and value.get("type") == "ack" and value["frame"] == frame)


@given(st.text(max_size=100))
def test_an_ack_gives_its_frame_id(frame: str) -> None:
    assert client_ack(json.dumps({"type": "ack", "frame": frame}), MAX) == frame


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[" * 1000, "must be JSON"),
        ("é" * 600, "at most 1024 bytes"),  # 600 characters, 1,200 bytes
        ("\ud800" * 400, "at most 1024 bytes"),
        ("1" * 1000, "the only client message"),
        ('{"type": "ack", "frame": 7}', "the only client message"),
    ],
)
def test_refusals_say_what_is_wrong(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        client_ack(text, MAX)
