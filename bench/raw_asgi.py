"""The fan-out benchmark's ceiling: a minimal raw ASGI application that sends its subscribers, at
the rate pgstreams is offered, the same bytes pgstreams would send them, encoded once per chunk,
with nothing else (no database, no Django, no flow control, no acks honoured). It starts each
subscriber's send without waiting for the one before it to finish (``delivery.start``), as
pgstreams' fans do: granian's sends wait for their socket's write, and awaited one after another
they capped this ceiling at a third of what pgstreams itself delivered. Unlike pgstreams, it does
not hold a socket's next frame until its last has gone: the subscribers count any frame out of
order as a gap.

It answers pgstreams' own URLs, so that the same subscribers (``node/fanout_load.mjs``) follow
either: ``ws/pgstreams/<id>/`` (WebSocket frames), ``pgstreams/streams/<id>/events`` (SSE) and
``pgstreams/v1/stream/<path>?live=sse`` (Durable Streams SSE). ``POST /raw/start`` with
``{"streams": [{"id", "path"}], "rate": per stream per second, "seconds": how long}`` starts a
writer task per stream; each chunk's data is its wall-clock time, as pgstreams' writers write it.

Run it under any server: ``daphne bench.raw_asgi:application``, ``uvicorn ...``, ``granian ...``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from typing import Any

from pgstreams import delivery

# stream id or path -> the sends of its subscribers, by kind
_subscribers: dict[str, dict[str, list[Any]]] = defaultdict(lambda: {"ws": [], "sse": [], "ds-sse": []})
_tasks: set[asyncio.Task[None]] = set()
_FIRST = {
    "sse": b"retry: 1000\n\n",
    "ds-sse": b'event: control\ndata:{"streamNextOffset": "0000000000000000_0000000000000000", '
    b'"streamCursor": "0"}\n\n',
}


def _encoded(kind: str, stream: str, offset: int, data: str) -> dict[str, Any]:
    if kind == "ws":
        item = f'{{"offset":{offset},"data":"{data}"}}'
        text = f'{{"type":"chunks","frame":"0123456789abcdef","stream":"{stream}","items":[{item}]}}'
        return {"type": "websocket.send", "text": text}
    if kind == "sse":
        body = f'id: {offset}\ndata: {{"offset":{offset},"data":"{data}"}}\n\n'.encode()
    else:
        control = json.dumps({"streamNextOffset": f"{offset + 1:016d}_{0:016d}", "streamCursor": "0"})
        body = f"event: data\ndata:[{data}]\n\nevent: control\ndata:{control}\n\n".encode()
    return {"type": "http.response.body", "body": body, "more_body": True}


async def _write(stream: dict[str, str], rate: float, seconds: float) -> None:
    """One stream's chunks at ``rate``, paced on absolute deadlines, each sent to every subscriber."""
    start = time.monotonic()
    for offset in range(int(rate * seconds)):
        deadline = start + offset / rate
        if (pause := deadline - time.monotonic()) > 0:
            await asyncio.sleep(pause)
        data = repr(time.time())
        for kind, key in (("ws", stream["id"]), ("sse", stream["id"]), ("ds-sse", stream["path"])):
            sends = _subscribers[key][kind]
            if sends:
                message = _encoded(kind, stream["id"], offset, data)
                for send in list(sends):
                    if (task := delivery.start(send(message))) is not None:
                        _tasks.add(task)
                        task.add_done_callback(_tasks.discard)


async def _until_disconnect(receive: Any) -> None:
    while (await receive())["type"] not in ("websocket.disconnect", "http.disconnect"):
        pass


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    path = scope["path"]
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        sends = _subscribers[path.split("/")[3]]["ws"]
        sends.append(send)
        try:
            await _until_disconnect(receive)
        finally:
            sends.remove(send)
        return
    if path == "/raw/start":
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        order = json.loads(body)
        for stream in order["streams"]:
            task = asyncio.create_task(_write(stream, order["rate"], order["seconds"]))
            _tasks.add(task)
            task.add_done_callback(_tasks.discard)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    if path.startswith("/pgstreams/v1/stream/"):
        kind, key = "ds-sse", path.removeprefix("/pgstreams/v1/stream/")
    else:  # /pgstreams/streams/<id>/events
        kind, key = "sse", path.split("/")[3]
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    # What pgstreams answers first, before any chunk (daphne sends the headers with it).
    await send({"type": "http.response.body", "body": _FIRST[kind], "more_body": True})
    sends = _subscribers[key][kind]
    sends.append(send)
    try:
        await _until_disconnect(receive)
    finally:
        sends.remove(send)
