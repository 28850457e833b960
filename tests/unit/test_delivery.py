"""Shared encodings: a batch is encoded once for every subscriber that sends it, its delivery is
counted once (with each chunk's age), and what is kept stays bounded and out of the garbage
collector's way. A response's body ends on an error, but not on a cancel."""

from __future__ import annotations

import asyncio
import datetime
import gc
import uuid
import zoneinfo

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Histogram, generate_latest

from pgstreams import delivery, metrics
from pgstreams.types import StreamChunk


def batch(stream: uuid.UUID, first: int, n: int) -> list[StreamChunk]:
    now = datetime.datetime.now(datetime.UTC)
    return [StreamChunk(stream, offset, f"c{offset}", now) for offset in range(first, first + n)]


def counted() -> float:
    return REGISTRY.get_sample_value("pgstreams_delivery_seconds_count") or 0.0


def test_a_batch_is_encoded_once_for_every_subscriber_and_counted_once() -> None:
    encodings = delivery.Encodings()
    stream, made = uuid.uuid4(), []

    def encode(chunks) -> str:
        made.append(len(chunks))
        return ",".join(c.data for c in chunks)

    before = counted()
    first = [encodings.get("ws", batch(stream, 0, 3), encode) for _ in range(10)]  # ten subscribers
    assert first == ["c0,c1,c2"] * 10 and made == [3] and counted() == before + 3
    assert encodings.get("sse", batch(stream, 0, 3), encode) == "c0,c1,c2" and made == [3, 3]  # another kind
    assert encodings.get("ws", batch(stream, 1, 2), encode) == "c1,c2" and made == [3, 3, 2]  # another range
    assert encodings.get("ws", batch(uuid.uuid4(), 0, 3), encode) == "c0,c1,c2" and len(made) == 4


def test_the_kept_encodings_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(delivery, "ENTRIES", 5)
    encodings = delivery.Encodings()
    stream = uuid.uuid4()
    for offset in range(20):
        encodings.get("ws", batch(stream, offset, 1), len)
    assert len(encodings._entries) == 5


def test_the_kept_encodings_hold_a_bounded_amount_of_chunk_data(monkeypatch) -> None:
    monkeypatch.setattr(delivery, "ENTRIES_BYTES", 1000)
    encodings = delivery.Encodings()
    stream, now = uuid.uuid4(), datetime.datetime.now(datetime.UTC)
    for offset in range(0, 100, 10):  # ten batches of ten 30-character chunks: 3,000 characters
        chunks = [StreamChunk(stream, o, "x" * 30, now) for o in range(offset, offset + 10)]
        assert encodings.get("ws", chunks, lambda c: "".join(x.data for x in c)) == "x" * 300
    assert len(encodings._entries) == 3 and encodings._bytes == 900
    huge = [StreamChunk(stream, 100, "y" * 5000, now)]
    assert encodings.get("ws", huge, lambda c: len(c[0].data)) == 5000  # handed out, not kept
    assert not encodings._entries and encodings._bytes == 0


def test_the_garbage_collector_stops_tracking_the_kept_encodings() -> None:
    # Kept for a few rounds, they would otherwise reach its old generation by the thousand.
    encodings = delivery.Encodings()
    stream = uuid.uuid4()
    encodings.get("ws", batch(stream, 0, 3), lambda chunks: ("c0,c1,c2", 8))
    encodings.get("sse", batch(stream, 0, 3), lambda chunks: b"data: c0")
    gc.collect()
    assert not any(gc.is_tracked(key) or gc.is_tracked(entry) for key, entry in encodings._entries.items())


@pytest.mark.parametrize("zone", [datetime.UTC, zoneinfo.ZoneInfo("Etc/UTC"), zoneinfo.ZoneInfo("Asia/Kolkata"), None])
def test_a_chunks_delivery_latency_is_its_age_in_any_time_zone_and_without_one(zone) -> None:
    """A chunk written 0.3 s ago is counted in the (0.25, 0.5] bucket, whatever zone its time
    comes in (pgstreams' connections give UTC; a naive time is local, as Python takes it)."""
    ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=0.3)
    created = ago.astimezone(zone) if zone is not None else ago.astimezone().replace(tzinfo=None)

    def bucket(le: str) -> float:
        return REGISTRY.get_sample_value("pgstreams_delivery_seconds_bucket", {"le": le}) or 0.0

    before = bucket("0.5") - bucket("0.25")
    metrics.observe_delivery([StreamChunk(uuid.uuid4(), 0, "x", created)])
    assert bucket("0.5") - bucket("0.25") == before + 1


def test_the_delivery_histogram_reads_as_prometheus_clients_histogram_fed_the_same_ages() -> None:
    """Counted by pgstreams itself (one lock a batch, not two an observation), the delivery
    latency reads in Prometheus' text format exactly as a prometheus_client Histogram fed the same
    ages, but for the Histogram's ``_created`` sample: an age on a bucket's bound counts in it, a
    negative one (clocks apart) as 0, one past the last bound in +Inf."""
    ages = [-0.2, 0.0, 0.005, 0.0051, 0.1, 0.3, 1.0, 7.5, 10.0, 11.0, 250.0]
    ours = metrics._DeliveryLatency()
    now = datetime.datetime.now(datetime.UTC)
    ours.observe([StreamChunk(uuid.uuid4(), 0, "x", now - datetime.timedelta(seconds=age)) for age in ages], now)
    theirs = Histogram("pgstreams_delivery", ours.DOCUMENTATION, unit="seconds", buckets=ours.BUCKETS, registry=None)
    for age in ages:
        theirs.observe(max(0.0, age))
    registries = CollectorRegistry(), CollectorRegistry()
    registries[0].register(ours)
    registries[1].register(theirs)
    exposed, expected = (generate_latest(registry).decode().splitlines() for registry in registries)
    assert exposed == [line for line in expected if "_created" not in line]
    assert 'pgstreams_delivery_seconds_bucket{le="0.005"} 3.0' in exposed


async def test_a_body_ends_on_an_error_after_its_last_words_but_a_cancel_is_never_swallowed() -> None:
    async def failing():
        yield b"a"
        raise RuntimeError("reading failed")

    async def slow_with_a_failing_cleanup():
        try:
            yield b"a"
            await asyncio.sleep(10)
        finally:
            raise RuntimeError("its cleanup failed")

    async def read(body) -> list[bytes]:
        return [part async for part in delivery.ending_on_error(body, "a test", lambda error: f"{error}".encode())]

    assert await read(failing()) == [b"a", b"reading failed"]
    reading = asyncio.create_task(read(slow_with_a_failing_cleanup()))
    await asyncio.sleep(0.05)
    reading.cancel()
    with pytest.raises(RuntimeError, match="its cleanup failed"):  # as without the wrapper; not [b"a", b"..."]
        await reading
