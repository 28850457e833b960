"""Compaction (``maintenance.compact``) folds a closed stream's chunks into runs, and every read
answers as it did before, during and after."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import random
import re
import uuid
from typing import Any

import pytest
import websockets
from asgiref.sync import sync_to_async
from django.db import connection
from django.test import AsyncClient, override_settings

import pgstreams
from pgstreams import aisdk, db, fetch, maintenance
from pgstreams.durable import wire
from pgstreams.models import Stream

pytestmark = pytest.mark.django_db(transaction=True)

FAR = "2999-01-01"  # a cutoff every closed stream is before
OPEN = override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": "demo_project.chat.durable.allow_everything"})


def closed_long_ago(*streams: Stream) -> None:
    """Closed an hour ago: past compaction's grace."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pgstreams_stream SET closed_at = now() - interval '1 hour' WHERE id = ANY(%s)",
            [[s.id for s in streams]],
        )


def write(values: list[Any], content_type: str = "text/plain", path: str | None = None) -> Stream:
    """A stream of ``values``, closed long ago; bytes as the Durable Streams endpoint stores them."""
    stream = Stream.objects.create(content_type=content_type, path=path)  # create_stream() makes text ones only
    if isinstance(values[0], bytes):
        with connection.cursor() as cursor:
            cursor.execute(
                'INSERT INTO pgstreams_chunk (stream_id, "offset", blob, created_at)'
                " SELECT %s, o - 1, b, now() + o * interval '1 ms' FROM unnest(%s::bytea[]) WITH ORDINALITY AS v(b, o)",
                [stream.id, values],
            )
            cursor.execute("UPDATE pgstreams_stream SET next_offset = %s WHERE id = %s", [len(values), stream.id])
    for start in range(0, len(values) if isinstance(values[0], str) else 0, 500):
        pgstreams.write_many(stream.id, values[start : start + 500])
    pgstreams.close(stream.id)
    closed_long_ago(stream)
    return Stream.objects.get(id=stream.id)


def pages(keys: list[tuple[uuid.UUID, int]]) -> dict[tuple[uuid.UUID, int], tuple[Any, ...]]:
    """Each key's page as the listener fetches it: its values, times, state and where to resume."""

    async def go() -> dict[Any, Any]:
        conn = await db.aconnect("default", "fetcher")
        try:
            return await fetch._fetch(conn, keys)
        finally:
            await conn.close()

    found = asyncio.run(go())
    return {k: (p.values, p.times, p.next_offset, p.closed, p.pruned_to, p.data) for k, p in found.items()}


def rows(stream: Stream) -> tuple[int, int]:
    """The stream's rows: of one chunk, and runs."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE run IS NULL), count(*) FILTER (WHERE run IS NOT NULL)"
            " FROM pgstreams_chunk WHERE stream_id = %s",
            [stream.id],
        )
        return cursor.fetchone()


def shapes() -> dict[str, tuple[list[Any], str]]:
    rng = random.Random(7)
    return {
        "tokens": ([rng.choice([" the", " and", " é", "ü", "日本", " 🙂"]) for _ in range(9000)], "text/plain"),
        "lines of 2 KB, cut by bytes": ([f"{i:06d} " + "x" * 2041 for i in range(1500)], "text/plain"),
        "chunks around a run's size": ([rng.choice("ab") * rng.randrange(1, 65_536) for _ in range(40)], "text/plain"),
        "bytes": ([rng.randbytes(rng.randrange(0, 300)) for _ in range(5000)], "application/octet-stream"),
    }


@pytest.mark.parametrize("shape", list(shapes()))
def test_every_page_is_the_same_before_and_after_compaction(shape: str) -> None:
    values, content_type = shapes()[shape]
    stream = write(values, content_type)
    rng = random.Random(shape)
    offsets = sorted({0, 1, len(values) - 1, len(values), len(values) + 5, *rng.sample(range(len(values)), 30)})
    keys = [(stream.id, o) for o in offsets]
    before = pages(keys)
    done = maintenance.compact(maintenance.parse_cutoff(FAR), batch=2500)
    assert done.streams == 1 and done.chunks > 0 and done.runs > 0
    plain, folded = rows(stream)
    assert folded == done.runs and plain + done.chunks == len(values)
    after = pages(keys)
    for key in keys:
        assert after[key] == before[key], f"the page from {key[1]} changed"


def test_a_stream_read_whole_while_it_is_compacted_slice_by_slice_gives_every_chunk_once_in_order() -> None:
    values = [f"t{i} " for i in range(12_000)]
    stream = write(values)
    read: list[str] = []
    compaction = maintenance._compact_slice
    slices = 0

    def read_a_page() -> None:
        read.extend(pages([(stream.id, len(read))])[(stream.id, len(read))][0])

    def slice_then_read(*args: Any) -> Any:
        nonlocal slices
        slices += 1
        read_a_page()
        return compaction(*args)

    maintenance._compact_slice = slice_then_read  # type: ignore[assignment]
    try:
        maintenance.compact(maintenance.parse_cutoff(FAR), batch=1000)
    finally:
        maintenance._compact_slice = compaction  # type: ignore[assignment]
    while len(read) < len(values):
        read_a_page()
    assert slices > 10 and read == values
    assert [(c.offset, c.data) for c in pgstreams.read(stream.id)] == list(enumerate(values))


def test_only_streams_closed_past_the_cutoff_and_the_grace_are_compacted() -> None:
    old = write(["a", "b", "c"])
    recent = pgstreams.create_stream()
    pgstreams.write_many(recent.id, ["a", "b", "c"])
    pgstreams.close(recent.id)  # just now: within the grace
    still_open = pgstreams.create_stream()
    pgstreams.write_many(still_open.id, ["a", "b", "c"])
    done = maintenance.compact(maintenance.parse_cutoff(FAR))
    assert (done.streams, done.chunks, done.runs) == (1, 3, 1)
    assert rows(old) == (0, 1) and rows(recent) == (3, 0) and rows(still_open) == (3, 0)
    assert Stream.objects.get(id=old.id).compacted_at is not None
    assert maintenance.compact(maintenance.parse_cutoff(FAR)).streams == 0  # done once


@pytest.mark.parametrize("shape", list(shapes()))
async def test_the_durable_streams_endpoint_answers_the_same_before_and_after_compaction(shape: str) -> None:
    values, content_type = shapes()[shape]
    path = f"compacted/{len(values)}"
    await sync_to_async(write)(values, content_type, path=path)
    rng = random.Random(shape)
    offsets = sorted({0, 1, len(values) - 1, len(values), *rng.sample(range(len(values)), 12)})
    client = AsyncClient()

    async def answers() -> list[tuple[Any, ...]]:
        found = []
        for offset, live in itertools.product(offsets, ("", "&live=sse")):
            response = await client.get(f"/pgstreams/v1/stream/{path}?offset={wire.format_offset(offset)}{live}")
            if response.streaming:  # SSE: its data and its last control event (how data is cut into
                # events follows the listener's timing, compacted or not)
                events = b"".join([part async for part in response.streaming_content]).split(b"\n\n")
                lines = [e.split(b"\n")[1:] for e in events if e.startswith(b"event: data")]
                payloads = [b"\n".join(line[5:].removeprefix(b" ") for line in event) for event in lines]
                if not content_type.startswith("text/"):  # each event's bytes in base64
                    payloads = [base64.b64decode(payload) for payload in payloads]
                data = b"".join(payloads)
                content = data + [e for e in events if e.startswith(b"event: control")][-1]
            else:
                content = response.content
            headers = {k: v for k, v in response.headers.items() if k.startswith(("Stream-", "ETag", "Cache"))}
            # A live answer's cursor is the clock's interval: before and after may straddle one.
            headers.pop("Stream-Cursor", None)
            content = re.sub(rb'"streamCursor":"\d+"', b'"streamCursor":"-"', content)
            found.append((offset, live, response.status_code, headers, content))
        return found

    with OPEN:
        before = await answers()
        done = await sync_to_async(maintenance.compact)(maintenance.parse_cutoff(FAR))
        assert done.streams == 1
        after = await answers()
    for old, new in zip(before, after, strict=True):
        assert new == old, f"the answer from {old[0]}{old[1]} changed"


@pytest.mark.parametrize("content_type", ["text/plain", "application/octet-stream"])
async def test_forks_of_a_compacted_stream_hold_and_cost_what_they_did(content_type: str) -> None:
    """Forks at offsets inside runs, on their edges and at the ends, with a sub-offset into an
    append, and with MAX_FORK_BYTES small enough that some are refused: each fork answers and
    holds the same as the same fork made before compaction."""
    if content_type == "text/plain":
        values: list[Any] = [f"{i:04d}é-" * (1 + i % 5) for i in range(6000)]
    else:
        values = [bytes([i % 251]) * (1 + i % 7) for i in range(6000)]
    await sync_to_async(write)(values, content_type, path="source")
    client = AsyncClient()
    forks = [(0, 0), (1, 0), (2000, 0), (4095, 0), (4096, 0), (4097, 0), (5999, 3), (6000, 0), (3000, 2)]

    async def fork_all(tag: str) -> list[tuple[Any, ...]]:
        found = []
        for offset, sub in forks:
            headers = {
                "Stream-Forked-From": "/pgstreams/v1/stream/source",
                "Stream-Fork-Offset": wire.format_offset(offset),
                "Content-Type": content_type,
            }
            if sub:
                headers["Stream-Fork-Sub-Offset"] = str(sub)
            made = await client.put(f"/pgstreams/v1/stream/fork-{tag}-{offset}-{sub}", headers=headers)
            read = await client.get(f"/pgstreams/v1/stream/fork-{tag}-{offset}-{sub}?offset=-1")
            whole = b""
            while read.status_code == 200 and read.content:
                whole += read.content
                if read.headers.get("Stream-Up-To-Date") == "true":
                    break
                read = await client.get(
                    f"/pgstreams/v1/stream/fork-{tag}-{offset}-{sub}?offset={read.headers['Stream-Next-Offset']}"
                )
            found.append((offset, sub, made.status_code, made.content, whole))
        return found

    with (
        OPEN,
        override_settings(
            PGSTREAMS={"DURABLE_AUTHORIZE": "demo_project.chat.durable.allow_everything", "MAX_FORK_BYTES": 600_000}
        ),
    ):
        before = await fork_all("before")
        assert (await sync_to_async(maintenance.compact)(maintenance.parse_cutoff(FAR))).streams == 1
        after = await fork_all("after")
    assert {b[2] for b in before} == {201, 400}  # some forks cost too much
    for old, new in zip(before, after, strict=True):
        assert new == old, f"the fork at {old[:2]} changed"


def test_the_admins_pages_and_preview_and_the_template_tag_show_the_same_after_compaction(rf) -> None:
    from django.contrib.auth.models import AnonymousUser
    from django.template import Context, Template

    from pgstreams import admin

    values = [f"{i}:" + "é" * (i % 9) for i in range(9000)]
    stream = write(values)
    small = write(["x"] * 12_000)  # over PREVIEW_CHUNKS, under PREVIEW_BYTES
    tag = Template("{% load pgstreams %}{% stream_html stream last=LAST last_bytes=BYTES %}")
    request = rf.get("/")
    request.user = AnonymousUser()

    def shown() -> list[Any]:
        pages = [admin._page(stream, first) for first in (0, 50, 4050, 4095, 8950, 9000)]
        tags = [
            tag.render(Context({"request": request, "stream": stream.id, "LAST": last, "BYTES": size}))
            for last, size in ((10_000, 1 << 20), (5000, 1 << 20), (10_000, 30_000), (3, 10), (1, 1))
        ]
        return [pages, admin._preview(stream), admin._preview(small), tags]

    before = shown()
    assert maintenance.compact(maintenance.parse_cutoff(FAR)).streams == 2
    assert shown() == before
    assert before[0][1][0][:2] == (50, "50:" + "é" * 5) and len(before[0][-1]) == 0
    assert before[2] == {"text": "x" * 10_000, "cut": True, "limit_kib": 64, "limit_chunks": "10,000"}


def test_the_command_and_the_task_compact_what_a_dry_run_announces(capsys) -> None:
    from django.core.management import CommandError, call_command

    from pgstreams import metrics, tasks

    first, second = write([f"{i} " for i in range(300)]), write(["a", "b"])
    call_command("pgstreams_compact", "--closed-before", "1m", "--dry-run")
    assert "would compact 2 stream(s)" in capsys.readouterr().out and rows(first) == (300, 0)
    counted = metrics.chunks_compacted._value.get()
    call_command("pgstreams_compact", "--closed-before", "1m", "--batch", "100")
    assert "compacted 2 stream(s): 302 chunk(s) into 4 run(s)" in capsys.readouterr().out
    assert rows(first) == (0, 3) and rows(second) == (0, 1)
    assert metrics.chunks_compacted._value.get() - counted == 302
    third = write(["c", "d", "e"])
    assert tasks.compact.call(closed_before="1m") == {"streams": 1, "chunks": 3, "runs": 1} and rows(third) == (0, 1)
    call_command("pgstreams_compact", "--closed-before", "1m")
    assert "nothing to compact" in capsys.readouterr().out
    with pytest.raises(CommandError, match="--closed-before 'soon' is neither an age"):
        call_command("pgstreams_compact", "--closed-before", "soon")


async def test_a_fork_into_a_pruned_gap_of_a_compacted_stream_holds_nothing_it_should_not() -> None:
    """A prune stopped after its first slice leaves a stream without its first chunks; a fork
    at an offset in that gap inherits nothing held, compacted or not (found by an attack: the
    run past the gap gave its chunks to the fork under other offsets)."""
    values = [f"v{i}é" for i in range(100)]
    stream = await sync_to_async(write)(values, path="gapped")

    def prune_a_slice() -> None:
        with connection.cursor() as cursor:
            cursor.execute('DELETE FROM pgstreams_chunk WHERE stream_id = %s AND "offset" < 50', [stream.id])

    await sync_to_async(prune_a_slice)()
    client = AsyncClient()

    async def fork(tag: str) -> tuple[int, int, bytes]:
        headers = {"Stream-Forked-From": "/pgstreams/v1/stream/gapped", "Stream-Fork-Offset": wire.format_offset(10)}
        made = await client.put(f"/pgstreams/v1/stream/gap-{tag}", headers={**headers, "Content-Type": "text/plain"})
        read = await client.get(f"/pgstreams/v1/stream/gap-{tag}?offset=-1")
        return made.status_code, read.status_code, read.content

    with OPEN:
        before = await fork("before")
        assert (await sync_to_async(maintenance.compact)(maintenance.parse_cutoff(FAR))).streams == 1
        after = await fork("after")
    assert after == before and before[:2] == (201, 410)


def test_a_run_that_cannot_be_read_fails_its_own_readers_and_no_other() -> None:
    """A run whose index is corrupt (cut short here): its stream's reader gets a StreamError,
    and a reader of another stream fetched in the same rounds reads on (found by an attack: the
    fetch round failed whole, again and again, and every reader of the process waited)."""
    bad = write([f"c{i}" for i in range(50)])
    assert maintenance.compact(maintenance.parse_cutoff(FAR)).streams == 1
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pgstreams_chunk SET run = substring(run FROM 1 FOR 3) WHERE stream_id = %s", [bad.id])
    good = write([f"g{i}" for i in range(20)])
    with pytest.raises(pgstreams.StreamError, match="unreadable"):
        list(pgstreams.read(bad.id, timeout=10))
    assert [c.data for c in pgstreams.read(good.id, timeout=10)] == [f"g{i}" for i in range(20)]


def unreadable() -> Stream:
    """A compacted stream whose run's index is cut short: every read of it fails."""
    stream = write([f"c{i}" for i in range(50)])
    assert maintenance.compact(maintenance.parse_cutoff(FAR)).streams == 1
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pgstreams_chunk SET run = substring(run FROM 1 FOR 3) WHERE stream_id = %s", [stream.id])
    return stream


async def test_sse_responses_whose_reading_fails_end_instead_of_raising_out_of_their_body() -> None:
    """Once a response has begun, an exception out of its body has no answer left to make, and
    daphne's handling of one stops the check that closes every later failed WebSocket of the
    process (found by the soak: sockets accepted, then silent for ever). The SSE view ends its
    response (EventSource resumes from Last-Event-ID); an AI SDK answer ends with an error part."""
    stream = await sync_to_async(unreadable)()
    sse = await AsyncClient().get(f"/pgstreams/streams/{stream.id}/events")
    assert sse.status_code == 200
    assert b"".join([part async for part in sse.streaming_content]) == b"retry: 1000\n\n"
    answer = b"".join([part async for part in aisdk.response(stream.id).streaming_content])
    assert answer.endswith(b'"errorText":"The answer could not be read on; reload to resume it."}\n\ndata: [DONE]\n\n')


async def test_a_websocket_whose_stream_cannot_be_read_gets_an_error_frame_and_a_close_under_every_server(
    any_server: str,
) -> None:
    """Reading fails (a corrupt run): the consumer says so and closes with 4500. Its close was
    1011, which daphne lets no application send: it raised, and the socket stayed open after
    the error frame, silent, for a client that waits for the close."""
    stream = await sync_to_async(unreadable)()
    url = f"ws://{any_server}/ws/pgstreams/{stream.id}/?from=0"
    async with websockets.connect(url, origin=f"http://{any_server}", open_timeout=10) as ws:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 10)  # bounded: the close, or a TimeoutError
    assert (frame["type"], frame["code"]) == ("error", 4500)
    assert ws.close_code == 4500
