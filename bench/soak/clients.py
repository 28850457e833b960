"""A soak client process: what browsers and Durable Streams clients do, against the daphne
servers, through the proxies that cut their sockets.

``python -m bench.soak.worker clients SLOT INCARNATION RUN_DIR SEED``. In one asyncio loop:

- WebSocket readers that ack as ``pgstreams.js`` does (by the last frame's id, every 128 chunks
  or after 250 ms) and, after any close but a final one, reconnect with ``?from=`` the next offset;
- SSE readers of ``streams/<id>/events`` that reconnect with ``Last-Event-ID``;
- Durable Streams readers, by catch-up then long-poll, or by SSE, each request from the offset
  the previous answer gave;
- Durable Streams writers: plain appends, and appends as idempotent producers retried with the
  same headers until they are answered.

Readers record their sessions as ``readers`` does (a reconnect continues the session: the
checker holds each answer to start where the last one ended). Stream lists come from the
database. Once the run settles, the writers stop (and say so in ``writers-done.<name>``) and the
readers leave when their sessions end.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import websockets
from django.db import Error, connections
from httpx_sse import aconnect_sse

from pgstreams.durable import wire

from .readers import Session
from .record import Known, Log, Streams, Tags, Worker, describe

WS_READERS, SSE_READERS, LONG_POLL_READERS, DS_SSE_READERS = 6, 4, 3, 3
PLAIN_WRITERS, PRODUCER_WRITERS = 2, 2
WRITE_RATE = 8.0  # appends/s per HTTP writer
ACK_EVERY, ACK_AFTER = 128, 0.25  # as pgstreams.js
RETRY = 0.3  # seconds before a reader reconnects, or a writer sends again
TIMEOUT = httpx.Timeout(10.0, read=30.0)
FINAL_CLOSES = {4400: "error", 4403: "error", 4404: "gone", 4410: "pruned"}


class Clients:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.log = Log(worker.run_dir, worker.name)
        self.tag = Tags(worker.name)
        self.streams = Streams(worker.rng("streams"))
        self.hosts: list[str] = worker.config()["hosts"]
        self._db = ThreadPoolExecutor(1, thread_name_prefix="soak-db")  # one Django connection
        self.rng = worker.rng("clients")

    async def refresh(self) -> None:
        if self.streams.stale():
            try:
                await asyncio.get_running_loop().run_in_executor(self._db, self._refresh)
            except Error:
                await asyncio.get_running_loop().run_in_executor(self._db, connections.close_all)

    def _refresh(self) -> None:
        if self.streams.stale():
            self.streams.refresh_sync()

    def host(self) -> str:
        return self.rng.choice(self.hosts)

    async def sessions(self, reader: str, follow: Any) -> None:
        """Sessions of one reader, one after another, until the run settles."""
        for n in range(10**9):
            if self.worker.settling():
                return
            await self.refresh()
            stream = self.streams.pick_any()
            if stream is None:
                await asyncio.sleep(0.2)
                continue
            session = Session(self.log, reader, n, stream, self.streams.start_offset(stream), None)
            try:
                how, details = await follow(session)
            except Exception as exc:  # a bug of the client or a broken promise: the checker judges
                how, details = "error", {"why": describe(exc)}
            session.end(how, **details)

    # -- WebSocket -------------------------------------------------------------------------------

    async def websocket(self, session: Session) -> tuple[str, dict[str, Any]]:
        position = session.start
        for _ in range(1000):  # bounded: reconnects of one session
            host = self.host()
            url = session.connecting(f"ws://{host}/ws/pgstreams/{session.stream.id}/?from={position}")
            error: dict[str, Any] = {}
            try:
                async with websockets.connect(url, origin=f"http://{host}", open_timeout=10, close_timeout=2) as ws:
                    acker = Acker(ws, position)
                    try:
                        async for raw in ws:
                            message = json.loads(raw)
                            if message["type"] == "chunks":
                                for item in message["items"]:
                                    session.took(item["offset"], item["data"])
                                    position = item["offset"] + 1
                                acker.read(message["frame"], position)
                            elif message["type"] == "end":
                                return "end", {"next": message["next_offset"]}
                            elif message["type"] == "error":
                                error = message
                    finally:
                        acker.stop()
                code = ws.close_code
            except (OSError, TimeoutError, websockets.WebSocketException) as exc:
                code = getattr(getattr(exc, "rcvd", None), "code", None)
            if code in FINAL_CLOSES:
                details = {"code": code, "why": error.get("message", "")}
                if "first_offset" in error:
                    details["first"] = error["first_offset"]
                return FINAL_CLOSES[code], details
            session.flush()
            await asyncio.sleep(RETRY)
        return "error", {"why": "too many reconnects"}

    # -- SSE (pgstreams' own) --------------------------------------------------------------------

    async def sse(self, session: Session) -> tuple[str, dict[str, Any]]:
        position = session.start
        for _ in range(1000):
            url = session.connecting(f"http://{self.host()}/pgstreams/streams/{session.stream.id}/events")
            headers = {"Last-Event-ID": str(position - 1)} if position > session.start else {}
            params = {} if headers else {"from": str(position)}
            try:
                async with (
                    httpx.AsyncClient(timeout=TIMEOUT) as client,
                    aconnect_sse(client, "GET", url, params=params, headers=headers) as source,
                ):
                    status = source.response.status_code
                    if status == 404:
                        return "gone", {"status": status}
                    if status < 500 and status != 200:
                        return "error", {"status": status}
                    async for event in _events(source):
                        if event.event == "message" and event.data:  # ("retry:" alone makes an empty one)
                            item = json.loads(event.data)
                            session.took(item["offset"], item["data"])
                            position = item["offset"] + 1
                        elif event.event == "end":
                            return "end", {"next": json.loads(event.data)["next_offset"]}
                        elif event.event == "error":
                            error = json.loads(event.data)
                            if "first_offset" in error:
                                return "pruned", {"first": error["first_offset"]}
                            return "gone", {"why": error["message"]}
            except (httpx.HTTPError, OSError):
                pass
            session.flush()
            await asyncio.sleep(RETRY)
        return "error", {"why": "too many reconnects"}

    # -- Durable Streams -------------------------------------------------------------------------

    def ds_url(self, stream: Known) -> str:
        return f"http://{self.host()}/pgstreams/v1/stream/{stream.path}"

    async def long_poll(self, session: Session) -> tuple[str, dict[str, Any]]:
        position, live = session.start, False
        async with httpx.AsyncClient(timeout=TIMEOUT) as client:
            for _ in range(100_000):  # bounded: requests of one session
                params = {"offset": wire.format_offset(position)}
                if live:
                    params["live"] = "long-poll"
                try:
                    response = await client.get(self.ds_url(session.stream), params=params)
                except (httpx.HTTPError, OSError):
                    await asyncio.sleep(RETRY)
                    continue
                if response.status_code in (404, 410):
                    return {404: "gone", 410: "pruned"}[response.status_code], {"status": response.status_code}
                if response.status_code >= 500:  # the server could not answer now (its database restarts)
                    await asyncio.sleep(RETRY)
                    continue
                if response.status_code not in (200, 204):
                    return "error", {"status": response.status_code, "why": response.text[:200]}
                given = wire.parse_offset(response.headers["Stream-Next-Offset"])
                messages = response.json() if response.status_code == 200 else []
                position = self.answered(session, position, messages, given)
                if response.headers.get("Stream-Closed") == "true":
                    return "end", {"next": position}
                live = live or response.headers.get("Stream-Up-To-Date") == "true"
        return "error", {"why": "too many requests"}

    def answered(self, session: Session, position: int, messages: list[Any], given: int) -> int:
        """Note the messages an answer carried from ``position``, and where it said to go on."""
        for i, message in enumerate(messages):
            session.took(position + i, json.dumps(message))
        session.flush()
        if given != position + len(messages):
            self.log(e="jump", r=session.reader, n=session.n, frm=position + len(messages), to=given)
        return given

    async def durable_sse(self, session: Session) -> tuple[str, dict[str, Any]]:
        position = session.start
        for _ in range(1000):
            params = {"offset": wire.format_offset(position), "live": "sse"}
            try:
                async with (
                    httpx.AsyncClient(timeout=TIMEOUT) as client,
                    aconnect_sse(client, "GET", self.ds_url(session.stream), params=params) as source,
                ):
                    status = source.response.status_code
                    if status in (404, 410):
                        return {404: "gone", 410: "pruned"}[status], {"status": status}
                    if status < 500 and status != 200:
                        return "error", {"status": status}
                    messages: list[Any] = []
                    async for event in _events(source):
                        if event.event == "data":
                            messages = json.loads(event.data)
                        elif event.event == "control":
                            control = json.loads(event.data)
                            given = wire.parse_offset(control["streamNextOffset"])
                            position, messages = self.answered(session, position, messages, given), []
                            if control.get("streamClosed"):
                                return "end", {"next": position}
            except (httpx.HTTPError, OSError):
                pass
            await asyncio.sleep(RETRY)
        return "error", {"why": "too many reconnects"}

    # -- Durable Streams writers -----------------------------------------------------------------

    async def writer(self, k: int, producer: bool) -> None:
        """Appends over HTTP; as a producer, each retried with the same headers until answered."""
        kind = "http-producer" if producer else "http"
        rng = self.worker.rng(f"{kind}{k}")
        seqs: dict[str, int] = {}
        producer_id = f"http-{self.worker.role}{self.worker.slot}-{k}"
        async with httpx.AsyncClient(timeout=TIMEOUT) as client:
            while not self.worker.settling():
                await asyncio.sleep(rng.expovariate(WRITE_RATE))
                await self.refresh()
                stream = self.streams.pick_open()
                if stream is None:
                    continue
                data = self.tag("h")
                headers = {"Content-Type": "application/json"}
                if producer:
                    seq = seqs.setdefault(stream.path, 0)
                    headers |= {
                        "Producer-Id": producer_id,
                        "Producer-Epoch": str(self.worker.incarnation),
                        "Producer-Seq": str(seq),
                    }
                self.log(e="try", k=kind, s=stream.path, d=[data])
                if await self.post(client, kind, stream, data, headers, retry=producer) and producer:
                    seqs[stream.path] += 1
        (self.worker.run_dir / f"writers-done.{self.worker.name}.{kind}{k}").touch()

    async def post(
        self, client: httpx.AsyncClient, kind: str, stream: Known, data: str, headers: dict[str, str], retry: bool
    ) -> bool:
        """POST one append (again and again, with ``retry``, while it fails); whether it is stored."""
        failed = False
        for _ in range(400):  # bounded: about two minutes of failures
            try:
                response = await client.post(self.ds_url(stream), content=data.encode(), headers=headers)
            except (httpx.HTTPError, OSError) as exc:
                failed, why = True, describe(exc)
            else:
                if response.status_code in (200, 204):
                    duplicate = retry and response.status_code == 204
                    offset = wire.parse_offset(response.headers["Stream-Next-Offset"]) - 1
                    self.log(e="ok", k=kind, s=stream.path, d=[data], o=None if duplicate else [offset])
                    return True
                if response.status_code < 500:  # refused: nothing of it stored by this attempt
                    why = f"{response.status_code}: {response.text[:200]}"
                    self.log(e="err", k=kind, s=stream.path, d=[data], why=why, absent=not failed)
                    return False
                failed, why = True, f"{response.status_code}: {response.text[:200]}"
            if not retry:
                self.log(e="err", k=kind, s=stream.path, d=[data], why=why, absent=False)
                return False
            self.log(e="retry", k=kind, s=stream.path, d=[data], why=why)
            await asyncio.sleep(RETRY)
        self.log(e="err", k=kind, s=stream.path, d=[data], why="gave up", absent=False)
        return False

    async def main(self) -> None:
        name = self.worker.name
        readers = [
            *(self.sessions(f"{name}/ws{k}", self.websocket) for k in range(WS_READERS)),
            *(self.sessions(f"{name}/sse{k}", self.sse) for k in range(SSE_READERS)),
            *(self.sessions(f"{name}/lp{k}", self.long_poll) for k in range(LONG_POLL_READERS)),
            *(self.sessions(f"{name}/dsse{k}", self.durable_sse) for k in range(DS_SSE_READERS)),
        ]
        writers = [
            *(self.writer(k, producer=False) for k in range(PLAIN_WRITERS)),
            *(self.writer(k, producer=True) for k in range(PRODUCER_WRITERS)),
        ]
        await asyncio.gather(*readers, *writers)
        await asyncio.get_running_loop().run_in_executor(self._db, connections.close_all)


async def _events(source: Any) -> AsyncIterator[Any]:
    """The events of an SSE answer; none of one that is not a 200 (a 5xx: the caller asks again)."""
    if source.response.status_code == 200:
        async for event in source.aiter_sse():
            yield event


class Acker:
    """Acks as pgstreams.js does: the last frame read, once 128 chunks are unacknowledged or
    250 ms after the first of them."""

    def __init__(self, ws: Any, position: int) -> None:
        self.ws = ws
        self.acked = position
        self.position = position
        self.frame: str | None = None
        self.timer: asyncio.TimerHandle | None = None

    def read(self, frame: str, position: int) -> None:
        self.frame, self.position = frame, position
        if self.position - self.acked >= ACK_EVERY:
            self.send()
        elif self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(ACK_AFTER, self.send)

    def send(self) -> None:
        self.stop()
        if self.position > self.acked and self.frame is not None:
            self.acked = self.position
            asyncio.ensure_future(self._send(json.dumps({"type": "ack", "frame": self.frame})))

    async def _send(self, text: str) -> None:
        try:
            await self.ws.send(text)
        except websockets.WebSocketException:
            pass  # closed meanwhile: the reader reconnects

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def main(worker: Worker) -> None:
    clients = Clients(worker)
    asyncio.run(clients.main())
    clients.log(e="done")
