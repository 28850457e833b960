"""Prometheus metrics of this process, with prometheus_client; the only module that knows it.

Counts the flusher and the listener already keep (their ``stats``) are read at scrape time by a
collector, so the hot paths keep one counter each. What has no such count is instrumented here:
chunks written, flush and append batch sizes and durations, readers, WebSocket and SSE clients, and the delivery
latency from a chunk's commit to its send. Each server process exposes its own figures.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .stats import FlusherStats, ListenerStats

chunks_written = Counter("pgstreams_chunks_written", "Chunks committed by writers in this process.")
flush_batch = Histogram(
    "pgstreams_flush_batch_streams",
    "Streams announced per flush of the notification buffer.",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000),
)
flush_seconds = Histogram(
    "pgstreams_flush_seconds",
    "Time to send one flush of the notification buffer.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
)
append_batch = Histogram(
    "pgstreams_append_batch_chunks",
    "Chunks per committed batch of the append path.",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000),
)
append_seconds = Histogram(
    "pgstreams_append_seconds",
    "Time to commit one batch of the append path, from its first statement to its commit's answer.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
)
readers = Gauge("pgstreams_active_readers", "Readers (read/aread) following a stream in this process.")
websocket_clients = Gauge("pgstreams_websocket_clients", "Open WebSocket clients reading a stream.")
sse_clients = Gauge("pgstreams_sse_clients", "Open Server-Sent Events responses.")
delivery_seconds = Histogram(
    "pgstreams_delivery_seconds",
    "From a chunk's commit (its created_at, the writing transaction's time) to its send to a browser.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
notify_queue_usage = Gauge(
    "pgstreams_notify_queue_usage",
    "The fraction of Postgres' notification queue in use, as this process last read it.",
)
stuck_listeners_ended = Counter(
    "pgstreams_stuck_listeners_ended",
    "Listener sessions of stopped or frozen processes this process ended to free the notification queue.",
)


def exposition() -> tuple[bytes, str]:
    """Every metric of this process in Prometheus' text format, and its content type."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


def observe_delivery(chunks: Any) -> None:
    """Commit-to-send latency of chunks just sent (created_at is the writing transaction's time,
    from the database's clock; on one host, or hosts in sync, it is the commit to within a write)."""
    now = datetime.datetime.now(datetime.UTC)
    for chunk in chunks:
        created = chunk.created_at  # aware from pgstreams' own connections: a subtraction, half a timestamp()'s cost
        age = (now - created).total_seconds() if created.tzinfo is not None else time.time() - created.timestamp()
        delivery_seconds.observe(max(0.0, age))


class _StatsCollector(Collector):
    """The flusher's and the listener's own counts, read when Prometheus scrapes."""

    def describe(self) -> Iterator[Any]:
        # Names only: prometheus_client would otherwise call collect() while this module loads.
        return _families(FlusherStats(), ListenerStats(), 0)

    def collect(self) -> Iterator[Any]:
        from . import listener, notify

        flusher = notify.current_flusher()
        hub = listener.current_listener()
        return _families(
            flusher.stats if flusher is not None else FlusherStats(),
            hub.stats if hub is not None else ListenerStats(),
            flusher.depth() if flusher is not None else 0,
        )


def _families(flushed: FlusherStats, seen: ListenerStats, depth: int) -> Iterator[Any]:
    for name, documentation, value in (
        ("pgstreams_notifications_sent", "Stream announcements sent by the flusher.", flushed.notified),
        ("pgstreams_flushes", "Flushes of the notification buffer.", flushed.flushes),
        (
            "pgstreams_notifications_dropped",
            "Announcements dropped (a failed flush, a full buffer).",
            flushed.dropped,
        ),
        ("pgstreams_listener_reconnects", "Reconnects of the LISTEN connection.", seen.reconnects),
        ("pgstreams_fallback_polls", "Fallback polls run by the listener.", seen.polls),
        (
            "pgstreams_fallback_found",
            "Polled streams that had chunks no notification announced.",
            seen.poll_found,
        ),
        ("pgstreams_fetches", "Fetch queries run by the listener.", seen.fetches),
        ("pgstreams_chunks_fetched", "Chunks fetched by the listener.", seen.chunks_fetched),
        (
            "pgstreams_chunk_data_fetched",
            "Data of the chunks fetched by the listener: characters of text, bytes of binary.",
            seen.data_fetched,
        ),
        (
            "pgstreams_read_behind",
            "Fetches that found READ_DATABASE behind what was announced (then asked again).",
            seen.read_behind,
        ),
    ):
        yield CounterMetricFamily(name, documentation, value=value)
    yield GaugeMetricFamily("pgstreams_buffer_depth", "Streams waiting in the notification buffer.", value=depth)


REGISTRY.register(_StatsCollector())
