"""The WebSocket consumer: sends one stream's chunks to a browser, resumable by offset.

It reads through this process's shared listener (``afollow``), so a thousand sockets do not
open a thousand database connections, until it is at its stream's tail; from then on the
stream's fan in this event loop delivers to it, with every other socket there at the tail
(``delivery``): one step through each round for them all, the frame's items encoded once, each
frame sent without waiting. It runs no SQL of its own beyond the authorization lookup, and
sends its frames past Channels' session wrapper. The protocol is described in docs/reference/websocket.md.

Flow control: the server keeps at most ``WINDOW_CHUNKS`` chunks or ``WINDOW_BYTES`` bytes (of
frames, counted exactly) sent but not acknowledged. An ack names a frame by the random id the
frame carried (``{"type": "ack", "frame": id}``), so only a client that has read that frame off
its socket can acknowledge it: a client that acks without reading holds one window of the
server's memory, whatever the ASGI server buffers. While the window is full the consumer holds
no chunk it has not sent (it reads again from its position once acks arrive; frames waiting for
a slow server's send to take them count in the window), and a client
silent for ``ACK_TIMEOUT`` seconds with its window full is closed with 4408 and may resume by
offset.

Every client frame but an ack of a frame sent on this socket is refused with 4400 and an error
frame saying why (``protocol.client_ack``). After a refusal no chunk frame goes out; the error
frame and the close wait for the frames sent before them, each for at most ``SEND_TIMEOUT``
seconds (a server whose sends wait while its client reads nothing: uvicorn, granian), after
which the client is given up and the consumer ends without them. However the consumer ends (a
close, a refusal, an exception), its pump is cancelled and its client counted out (``stop``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import uuid
from collections import deque
from typing import Any, Final
from urllib.parse import parse_qs

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.sessions import InstanceSessionWrapper
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError

from . import delivery, metrics, protocol
from .auth import readable_stream
from .exceptions import ChunksPruned, StreamError, StreamNotFound
from .protocol import BAD_REQUEST, FORBIDDEN, NOT_FOUND, PRUNED, SERVER_ERROR, TOO_SLOW
from .reader import Progress, afollow
from .types import StreamChunk

logger = logging.getLogger("pgstreams.consumers")

WINDOW_CHUNKS = 1024
WINDOW_BYTES = 1 << 20
FRAME_BYTES = 256 * 1024  # a batch larger than this is split over several frames
ACK_TIMEOUT = 60.0
SEND_TIMEOUT = 10.0  # for a frame to be taken by a client when the server's send waits for it
FRAME_ID_BYTES = 8  # random bytes of a frame's id (sent as hex), which the client's ack names
MAX_CLIENT_FRAME = 1024  # bytes; the only client message is a small ack


# What send_while_window_open() stops at, besides the stream's end.
FULL: Final = "the window is full"
CAUGHT_UP: Final = "at the stream's tail"


class StreamConsumer(AsyncJsonWebsocketConsumer):
    """``ws/pgstreams/<uuid:stream_id>/?from=<offset>``: a stream's chunks as JSON frames."""

    pump: asyncio.Task[None] | None = None  # from a successful connect until stop()
    main: asyncio.Task[Any] | None = None  # the task that reads the client's messages
    sending: asyncio.Task[None] | None = None  # a frame's send that had to wait
    refused = False  # or given up: no chunk frame goes out any more, no client frame is heard
    abandoned = False  # given up: main was cancelled to end the consumer

    async def connect(self) -> None:
        self.outbox: deque[dict[str, Any]] = deque()  # frames to send after the one sending
        self.broken = False  # a send failed: nothing more goes out
        # Accept first: a close code only reaches the client on an accepted socket.
        await self.accept()
        self.acked = asyncio.Event()
        self.acked_to = 0  # the client has every chunk below this offset
        self.unacked: deque[tuple[str, int, int]] = deque()  # (frame id, offset after it, its bytes)
        self.unacked_bytes = 0
        try:
            self.stream_id = _stream_id(self.scope["url_route"]["kwargs"]["stream_id"])
            query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
            self.position = self.acked_to = protocol.parse_offset(query.get("from"), "from")
        except (ValueError, KeyError) as exc:
            return await self.refuse(BAD_REQUEST, str(exc))
        try:
            stream = await readable_stream(self.scope.get("user"), self.stream_id)
        except StreamNotFound:
            return await self.refuse(NOT_FOUND, f"no stream {self.stream_id}")
        except PermissionDenied:
            return await self.refuse(FORBIDDEN, f"not allowed to read stream {self.stream_id}")
        except Exception as exc:  # the database lost, the project's AUTHORIZE failing: closed here, as servers differ
            if isinstance(exc, DatabaseError):
                logger.warning("pgstreams: cannot look stream %s up for a WebSocket: %s", self.stream_id, exc)
            else:
                logger.exception("pgstreams: looking stream %s up for a WebSocket failed", self.stream_id)
            return await self.refuse(
                SERVER_ERROR, f"could not look the stream up; reconnect with ?from={self.position}"
            )
        if self.position > stream.next_offset:
            return await self.refuse(BAD_REQUEST, protocol.past_end(self.position, stream))
        # The bytes of a chunks frame around its items: the same for every frame of this socket.
        self.stream_text = str(self.stream_id)  # as its frames name it: a UUID's str() is Python code
        self.envelope = len(protocol.chunks_frame("0" * 2 * FRAME_ID_BYTES, self.stream_text, ""))
        self.send_raw = server_send(self.base_send)
        self.pump = asyncio.create_task(self.send_chunks(), name=f"pgstreams-ws-{self.stream_id}")
        metrics.websocket_clients.inc()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Channels' consumer loop without a channel layer (this consumer joins no group, and a
        layer's channel per socket costs memory and a task per message) and without a task per
        message from the client: they are read and dispatched in turn."""
        self.scope = scope
        self.channel_layer = None
        self.base_send = send
        self.main = asyncio.current_task()
        try:
            with contextlib.suppress(StopConsumer):
                while True:
                    await self.dispatch(await receive())
        except asyncio.CancelledError:
            # Cancelled by abandon() alone: the consumer ends, as it meant to.
            if not self.abandoned or self.main.uncancel() > 0:
                raise
        finally:
            self.stop()  # whatever ended it: an exception leaves no pump and no client counted

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Channels' dispatch without its ``close_old_connections`` before every message: that is
        a hop to a thread for each ack, and this consumer holds no Django connection (its one
        query, the authorization lookup, runs on pgstreams' own threads)."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"no handler for message type {message['type']}")
        await handler(message)

    async def disconnect(self, code: int) -> None:
        self.stop()

    def stop(self) -> None:
        """The socket is done with: cancel its pump and any send still waiting, and count the
        client out; once, whatever called it first (the disconnect, the consumer's end)."""
        pump, self.pump = self.pump, None
        if pump is None:
            return
        self.refused = self.broken = True
        self.outbox.clear()
        pump.cancel()
        if self.sending is not None:
            self.sending.cancel()
        metrics.websocket_clients.dec()

    async def refuse(self, code: int, message: str, **details: Any) -> None:
        """Close with ``code`` after an error frame that says why, once the frames sent before it
        (which its offsets count) have gone; no chunk frame goes out after it."""
        if self.refused:
            return  # refused already, or given up
        self.refused = True
        if self.pump is not None and self.pump is not asyncio.current_task():
            self.pump.cancel()
        await self.say(
            {"type": "websocket.send", "text": json.dumps(protocol.error_frame(code, message, **details))},
            {"type": "websocket.close", "code": code},
        )

    async def say(self, *messages: dict[str, Any]) -> None:
        """Send ``messages`` after every frame sent so far. A client that takes no frame for
        SEND_TIMEOUT seconds (it reads nothing, and the server's send waits) is given up."""
        try:
            while self.sending is not None:
                async with asyncio.timeout(SEND_TIMEOUT):
                    await asyncio.wait([self.sending])
            for message in messages:
                async with asyncio.timeout(SEND_TIMEOUT):
                    await self.base_send(message)
        except TimeoutError:
            logger.info("pgstreams: a WebSocket client took no frame for %.0f s; giving it up", SEND_TIMEOUT)
            self.abandon()

    def abandon(self) -> None:
        """End the consumer without its client (which reads nothing), holding nothing of it.
        daphne then drops the connection once its client leaves a ping unanswered (``--ping-timeout``,
        30 s); uvicorn and granian close it once the client has taken the frames they queued (ASGI
        cannot reset one), so it stays while the client stays.
        Raises StopConsumer in the consumer's main task; cancels it from another."""
        self.abandoned = True
        self.stop()
        if self.main is asyncio.current_task():
            raise StopConsumer
        if self.main is not None:
            self.main.cancel()

    # -- server to client ----------------------------------------------------------------------

    async def send_chunks(self) -> None:
        """The socket's pump: reads by itself until it is at the stream's tail, then lets the
        stream's fan deliver (``delivery.follow``) until the fan hands it back: its window is
        full (it waits for acks), it fell behind, the stream ended or its reading failed."""
        try:
            while True:
                state = await self.send_while_window_open()
                if state is FULL:
                    await self.window_open()
                    continue
                if state is CAUGHT_UP:
                    state = await delivery.follow(self.stream_id, self)
                    if state is None:
                        continue
                if isinstance(state, BaseException):
                    raise delivery.reraised(state)
                break  # the end
            await self.say({"type": "websocket.send", "text": json.dumps(protocol.end_frame(self.position))})
            await self.drained()
            await self.say({"type": "websocket.close", "code": 1000})
        except asyncio.CancelledError:
            raise
        except StreamNotFound as exc:
            await self.refuse(NOT_FOUND, str(exc))
        except ChunksPruned as exc:
            await self.refuse(PRUNED, str(exc), first_offset=exc.first_offset)
        except TimeoutError:
            await self.refuse(TOO_SLOW, f"no ack for {ACK_TIMEOUT:.0f} s; reconnect with ?from={self.acked_to}")
        except StreamError as exc:
            logger.warning("pgstreams: closing WebSocket on stream %s: %s", self.stream_id, exc)
            await self.refuse(SERVER_ERROR, f"{exc}; reconnect with ?from={self.position}")

    async def send_while_window_open(self) -> object:
        """Send frames from ``position`` until the window is full (FULL), the socket has caught up
        with the stream's tail (CAUGHT_UP) or the stream has ended (``delivery.END``). What was
        read but does not fit is dropped, not held: it is read again once the client makes room."""
        async with contextlib.aclosing(afollow(self.stream_id, from_offset=self.position)) as batches:
            async for progress in batches:
                if not self.send_what_fits(progress):
                    return FULL
                if progress.closed:
                    return delivery.END
                if progress.caught_up:
                    return CAUGHT_UP
        return delivery.END

    def take(self, progress: Progress) -> bool:
        """``delivery.Follower``: send a round's chunks, if the window takes them all."""
        return self.send_what_fits(progress)

    def send_what_fits(self, progress: Progress) -> bool:
        """Send ``progress``' chunks in frames while the window has room; False if it filled first
        (or the socket was refused: then nothing is sent)."""
        batch, size = progress.chunks, progress.size
        while batch:
            if self.window_full() or self.refused:
                return False
            batch, size = self.send_frame(batch, size), None
        return True

    def send_frame(self, batch: list[StreamChunk], size: int | None = None) -> list[StreamChunk]:
        """Send the first chunks of ``batch`` (of ``size`` characters or bytes of data, if known)
        that fit the window in one frame; return the rest.
        A whole batch that fits goes as the items every subscriber at it sends (``delivery``);
        a frame of a batch split to fit is this socket's own (and counted by it). The frame is
        sent without waiting, after those sent before it."""
        frame = _frame_ids.next()
        max_items = WINDOW_CHUNKS - (self.position - self.acked_to)
        max_bytes = min(FRAME_BYTES, WINDOW_BYTES - self.unacked_bytes) - self.envelope
        # Its data's length is less than its items' bytes: a batch longer than that is split.
        if size is None:
            size = sum(len(chunk.data) for chunk in batch)
        fits = len(batch) <= max_items and size <= max_bytes
        if fits:
            items, items_bytes = delivery.shared("ws", batch, protocol.batch_items)
            fits = items_bytes <= max_bytes
        sent = batch
        if not fits:
            parts = protocol.frame_items(batch, max_items, max_bytes)
            sent = batch[: len(parts)]
            items = ",".join(parts)
            items_bytes = len(items.encode())
            metrics.observe_delivery(sent)
        # Counted before it is sent: a fast client's ack may come back before send() returns.
        self.position = sent[-1].offset + 1
        frame_bytes = self.envelope + items_bytes
        self.unacked.append((frame, self.position, frame_bytes))
        self.unacked_bytes += frame_bytes
        self.send_soon({"type": "websocket.send", "text": protocol.chunks_frame(frame, self.stream_text, items)})
        return batch[len(sent) :]

    def send_soon(self, message: dict[str, Any]) -> None:
        """Send ``message`` now if nothing waits to be sent before it, else after it; never wait
        (a slow client's server may make a send wait, and a fan delivers to many sockets). After
        a send fails nothing more is sent: the frames after a lost one would leave a gap."""
        if self.sending is not None:
            self.outbox.append(message)
            return
        if self.broken:
            return
        try:
            self.sending = delivery.start(self.send_raw(message))
        except Exception as exc:
            return self.send_failed(exc)
        if self.sending is not None:
            self.sending.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self.sending = None
        if task.cancelled() or task.exception() is not None:
            return self.send_failed(task.exception() if not task.cancelled() else None)
        while self.outbox and self.sending is None and not self.broken:
            self.send_soon(self.outbox.popleft())

    def send_failed(self, error: BaseException | None) -> None:
        """A frame did not go out (the socket is going, mostly): stop sending and end the pump;
        the client resumes by offset, from what it acknowledged."""
        logger.debug("pgstreams: a send failed on stream %s: %r", self.stream_id, error)
        self.broken = True
        self.outbox.clear()
        if self.pump is not None:
            self.pump.cancel()

    def window_full(self) -> bool:
        return self.position - self.acked_to >= WINDOW_CHUNKS or self.unacked_bytes >= WINDOW_BYTES

    async def window_open(self) -> None:
        """Wait until the client's unacknowledged chunks and bytes are under the window."""
        while self.window_full():
            self.acked.clear()
            async with asyncio.timeout(ACK_TIMEOUT):  # not wait_for(), which swallowed cancels on 3.11
                await self.acked.wait()

    async def drained(self) -> None:
        """Wait, at most ACK_TIMEOUT, until the client has acknowledged every chunk or closed.

        Closing at once would be unsafe for a client still reading: daphne aborts a connection
        whose client has not answered the close within a second, and the abort discards what the
        client had not read yet, the end frame included.
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(ACK_TIMEOUT):
                while self.acked_to < self.position:
                    self.acked.clear()
                    await self.acked.wait()

    # -- client to server ----------------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        if self.refused:
            return  # what the client says now changes nothing
        if text_data is None:
            return await self.refuse(BAD_REQUEST, "binary frames are not accepted; send JSON text")
        try:
            frame = protocol.client_ack(text_data, MAX_CLIENT_FRAME)
        except ValueError as exc:
            return await self.refuse(BAD_REQUEST, str(exc))
        if not self.ack(frame):
            await self.refuse(BAD_REQUEST, "ack for a frame not sent on this socket, or already acknowledged")

    def ack(self, frame: str) -> bool:
        """The client has read every frame up to and including ``frame``; False if no frame
        waiting for an ack has that id."""
        if not any(waiting == frame for waiting, _, _ in self.unacked):
            return False
        while self.unacked:
            waiting, end, size = self.unacked.popleft()
            self.unacked_bytes -= size
            self.acked_to = end
            if waiting == frame:
                break
        self.acked.set()
        return True


class _FrameIds:
    """Frame ids: FRAME_ID_BYTES random bytes each, in hex, from the system's CSPRNG like
    ``secrets.token_hex``, but drawn ``IDS_AT_ONCE`` at a time (a system call per frame cost a
    few percent of a server's CPU). Each id is as unpredictable as its own draw: knowing the
    ids of frames read tells nothing of another's, so only a client that read a frame can ack it."""

    IDS_AT_ONCE = 512

    def __init__(self) -> None:
        self._ids: list[str] = []
        os.register_at_fork(after_in_child=self._ids.clear)  # a child draws its own

    def next(self) -> str:
        if not self._ids:
            pool = os.urandom(FRAME_ID_BYTES * self.IDS_AT_ONCE).hex()
            step = 2 * FRAME_ID_BYTES
            self._ids = [pool[i : i + step] for i in range(0, len(pool), step)]
        return self._ids.pop()


_frame_ids = _FrameIds()


def server_send(send: Any) -> Any:
    """The server's own send, under Channels' session wrappers: they act only on HTTP responses
    (to save the session and set its cookie), and this consumer never changes the session, but
    each costs every frame an await. Authentication stays where it was, at connect."""
    while isinstance(getattr(send, "__self__", None), InstanceSessionWrapper):
        send = send.__self__.real_send
    return send


def _stream_id(value: str | uuid.UUID) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ValueError(f"{value[:40]!r} is not a stream id (stream ids are UUIDs)") from None
