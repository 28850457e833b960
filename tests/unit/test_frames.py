"""How the WebSocket consumer fills a frame (protocol.frame_items): at least one chunk, then as many
as the limits allow, sized in exact bytes of the JSON it sends."""

from __future__ import annotations

import datetime
import json
import uuid

from hypothesis import given
from hypothesis import strategies as st

from pgstreams.protocol import frame_items, sse_chunk
from pgstreams.types import StreamChunk

AT = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def chunks(*data: str) -> list[StreamChunk]:
    return [StreamChunk(uuid.uuid4(), i, d, AT) for i, d in enumerate(data)]


def size(items: list[str]) -> int:
    return len(",".join(items).encode())


def test_items_are_the_json_of_each_chunk_escapes_and_all() -> None:
    data = ["plain", 'quote " and \\ backslash', "\x01\x1f control", "é ü 😀", "line\nbreak"]
    items = frame_items(chunks(*data), max_items=10, max_bytes=10_000)
    assert [json.loads(i) for i in items] == [{"offset": i, "data": d} for i, d in enumerate(data)]


def test_the_byte_limit_counts_escapes_and_commas_exactly() -> None:
    control = "\x01" * 100  # 600 bytes once escaped
    one = size(frame_items(chunks(control), 10, 10_000))
    assert size(frame_items(chunks(control, control, control), 10, 2 * one + 1)) == 2 * one + 1
    assert len(frame_items(chunks(control, control, control), 10, 2 * one)) == 1  # the comma does not fit


def test_a_frame_carries_at_least_one_chunk_and_at_most_maxframe_items() -> None:
    assert len(frame_items(chunks("x" * 1000), max_items=10, max_bytes=1)) == 1
    assert len(frame_items(chunks(*"abcdef"), max_items=4, max_bytes=10_000)) == 4


def test_bytes_travel_in_base64_and_say_so_in_websocket_frames_and_sse_events() -> None:
    stream = [StreamChunk(uuid.uuid4(), 0, b"\x00\xff\n", AT)]
    (item,) = frame_items(stream, max_items=10, max_bytes=10_000)
    assert json.loads(item) == {"offset": 0, "data": "AP8K", "encoding": "base64"}
    event = sse_chunk(stream[0]).decode()
    assert json.loads(event.split("data: ", 1)[1]) == {"offset": 0, "data": "AP8K", "encoding": "base64"}


@given(st.text())
def test_a_chunks_text_is_written_as_json_dumps_writes_it_without_ascii_escapes(text: str) -> None:
    (item,) = frame_items(chunks(text), 1, 2**62)
    assert item == f'{{"offset":0,"data":{json.dumps(text, ensure_ascii=False)}}}'
    assert sse_chunk(chunks(text)[0]) == f"id: 0\ndata: {item}\n\n".encode()
