"""Prometheus metrics of this process, with prometheus_client; the only module that knows it.

Counts the flusher and the listener already keep (their ``stats``) are read at scrape time by a
collector, so the hot paths keep one counter each. What has no such count is instrumented here:
chunks written and compacted, flush and append batch sizes and durations, readers, WebSocket and
SSE clients, and the delivery latency from a chunk's commit to its send. Each server process
exposes its own figures.
"""

from __future__ import annotations

import bisect
import datetime
import itertools
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from .stats import FlusherStats, ListenerStats

chunks_written = Counter("pgstreams_chunks_written", "Chunks committed by writers in this process.")
chunks_compacted = Counter("pgstreams_chunks_compacted", "Chunks folded into runs by compaction in this process.")
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
chat_requests = Gauge(
    "pgstreams_chat_requests", "Requests of the AI SDK's WebSocket chat transport being answered (aisdk_ws)."
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


class _DeliveryLatency(Collector):
    """``pgstreams_delivery_seconds``, a histogram observed once per chunk sent: kept as plain
    counts under one lock per batch, where prometheus_client's Histogram takes two locks per
    observation (a microsecond a chunk, at tens of thousands of chunks a second). Exposed as that
    Histogram exposes it, but for its ``_created`` sample."""

    NAME = "pgstreams_delivery_seconds"
    DOCUMENTATION = "From a chunk's commit (its created_at, the writing transaction's time) to its send to a browser."
    BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = [0] * (len(self.BUCKETS) + 1)  # per bucket, not cumulative; the last is +Inf
        self._sum = 0.0

    def observe(self, chunks: Iterable[Any], now: datetime.datetime | None = None) -> None:
        """Commit-to-send latency of chunks just sent (created_at is the writing transaction's
        time, from the database's clock; on one host, or hosts in sync, it is the commit to
        within a write), at ``now`` (by default, now)."""
        if now is None:
            now = datetime.datetime.now(datetime.UTC)
        counts, bounds = self._counts, self.BUCKETS
        with self._lock:
            for chunk in chunks:
                created = chunk.created_at
                if created.tzinfo is not None:  # as from pgstreams' own connections: a subtraction
                    age = (now - created).total_seconds()
                else:
                    age = now.timestamp() - created.timestamp()
                if age < 0.0:
                    age = 0.0
                counts[bisect.bisect_left(bounds, age)] += 1  # the first bucket whose bound is >= age
                self._sum += age

    def describe(self) -> Iterator[Any]:
        yield HistogramMetricFamily(self.NAME, self.DOCUMENTATION)

    def collect(self) -> Iterator[Any]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        bounds = [*map(floatToGoString, self.BUCKETS), "+Inf"]
        buckets = list(zip(bounds, itertools.accumulate(counts), strict=True))
        yield HistogramMetricFamily(self.NAME, self.DOCUMENTATION, buckets=buckets, sum_value=total)


delivery_seconds = _DeliveryLatency()
observe_delivery = delivery_seconds.observe


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
REGISTRY.register(delivery_seconds)
