"""The benchmark's catch-up part (``--catch-up``): one reader reads a closed stream of chunks of
one size from its start, over WebSocket (acking each frame, as ``pgstreams.js`` does) and over
pgstreams' SSE (resuming each response that ends after its bytes from ``Last-Event-ID``, as
``EventSource`` does), from one server process of the demo. Per chunk size, server and transport:
the reader's MB/s and what the server's listener fetched for it, as a multiple of what it was
sent (the server's own metrics), and how much the server grew. The readers are Python clients
in this process: their MB/s is a floor, the fetched multiple is the point.

The Durable Streams catch-up is ``--durable``'s part: its reads are its own query's, not the
listener's."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import websockets

import pgstreams

from .fanout import METRICS_TOKEN, _rss, serving
from .run import LABEL

TRANSPORTS = ("ws", "sse")


@dataclass
class CatchUpConfig:
    chunk_sizes: tuple[int, ...] = (1024, 65536)
    megabytes: float = 20.0  # of each stream
    servers: tuple[str, ...] = ("daphne",)


async def _read_websocket(base: str, stream_id: str) -> list[int]:
    offsets: list[int] = []
    url = f"ws{base.removeprefix('http')}/ws/pgstreams/{stream_id}/?from=0"
    async with websockets.connect(url, origin=base, max_size=None, open_timeout=20) as ws:
        async for raw in ws:
            frame = json.loads(raw)
            if frame["type"] == "chunks":
                offsets.extend(item["offset"] for item in frame["items"])
                await ws.send(json.dumps({"type": "ack", "frame": frame["frame"]}))
            elif frame["type"] == "end":
                return offsets
            else:
                raise RuntimeError(f"the WebSocket said {frame}")
    raise RuntimeError("the WebSocket closed before the stream's end")


def read_websocket(base: str, stream_id: str) -> list[int]:
    """The offsets a WebSocket client that acks each frame gets, from 0 to the stream's end."""
    return asyncio.run(_read_websocket(base, stream_id))


def read_sse(base: str, stream_id: str) -> list[int]:
    """The offsets an SSE client gets, from 0 to the stream's end, resuming each response that
    ends without ``end`` from Last-Event-ID (at most 100,000 responses)."""
    offsets: list[int] = []
    with httpx.Client(base_url=base, timeout=30) as client:
        for _ in range(100_000):  # bounded: a response carries a chunk at least
            headers = {"Last-Event-ID": str(offsets[-1])} if offsets else {}
            event = None
            with client.stream("GET", f"/pgstreams/streams/{stream_id}/events", headers=headers) as answer:
                answer.raise_for_status()
                for line in answer.iter_lines():
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("id: "):
                        offsets.append(int(line[4:]))
            if event == "end":
                return offsets
            if event is not None:
                raise RuntimeError(f"the SSE response ended with {event}")
    raise RuntimeError("no end after 100,000 SSE responses")


READERS: dict[str, Callable[[str, str], list[int]]] = {"ws": read_websocket, "sse": read_sse}


def fetched(base: str) -> int:
    """The chunk data a server's listener has fetched, by its metrics."""
    answer = httpx.get(f"{base}/pgstreams/metrics/", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    answer.raise_for_status()
    found = re.search(r"^pgstreams_chunk_data_fetched_total (\S+)$", answer.text, re.M)
    if found is None:
        raise RuntimeError("the server's metrics have no pgstreams_chunk_data_fetched_total")
    return int(float(found[1]))


def run_catch_up(config: CatchUpConfig, say: Callable[[str], None] = print) -> dict[str, Any]:
    runs = []
    for size in config.chunk_sizes:
        chunks = max(1, int(config.megabytes * 1e6 // size))
        stream = pgstreams.create_stream(label=LABEL)
        for at in range(0, chunks, 100):
            pgstreams.write_many(stream.id, ["x" * size] * min(100, chunks - at))
        pgstreams.close(stream.id)
        sent = chunks * size
        for server in config.servers:
            for transport in TRANSPORTS:
                with serving(server, "demo_project.asgi:application") as (base, process):
                    before, grown_from = fetched(base), _rss(process)
                    began = time.monotonic()
                    offsets = READERS[transport](base, str(stream.id))
                    seconds = time.monotonic() - began
                    read, grown = fetched(base) - before, _rss(process) - grown_from
                if offsets != list(range(chunks)):
                    raise RuntimeError(f"{transport} on {server}: {len(offsets)} offsets, not 0 to {chunks - 1}")
                row = {
                    "server": server,
                    "transport": transport,
                    "chunk_bytes": size,
                    "chunks": chunks,
                    "megabytes_per_second": round(sent / 1e6 / seconds, 1),
                    "fetched_per_sent": round(read / sent, 3),
                    "server_grew_mib": round(grown / 2**20, 1),
                }
                say(f"catch-up: {row}")
                runs.append(row)
        stream.delete()
    return {"catch_up": {"config": vars(config), "runs": runs}}


def table(report: dict[str, Any]) -> str:
    lines = ["server   transport chunk   chunks   MB/s  fetched/sent  server grew MiB"]
    for row in report["catch_up"]["runs"]:
        lines.append(
            f"{row['server']:<8} {row['transport']:<9} {row['chunk_bytes']:>5} {row['chunks']:>8} "
            f"{row['megabytes_per_second']:>6} {row['fetched_per_sent']:>13} {row['server_grew_mib']:>16}"
        )
    return "\n".join(lines)
