"""The AI SDK's ``WebSocketChatTransport`` (npm ``ai`` 7) served from pgstreams: ``ChatConsumer``,
a Channels consumer that a project subclasses with two methods, ``start_answer`` (a ``send``
frame: start an answer, return its stream) and ``latest_answer`` (a ``resume`` frame: the chat's
answer to replay, or None), and routes behind ``CsrfOriginValidator`` and Channels'
``AuthMiddlewareStack`` as pgstreams' own routes are.

One socket carries up to ``max_requests`` requests at once (``requestId``), each the answer of
one stream, read through this process's listener and its stream's fan as the other endpoints
read (``delivery``): a ``start`` frame once the answer is found, a ``chunk`` frame a part, whose
``sequence`` is the part's offset in its stream, and an ``end`` frame after the part that closed
it (``finish``, ``error`` or ``abort``). A ``resume`` replays the answer from its first part
(the transport sends no ``lastSequence``, and replaces the message it had), or from
``lastSequence + 1`` when a client gives one. An ``abort`` frame (useChat's ``stop()``) stops
sending the request and, when ``stop_on_abort`` is set, as it is by default, ends its answer for
every reader (``aisdk.astop``); a socket that closes stops nothing, and its answers go on being
written. An answer silent for ``aisdk.HEARTBEAT`` seconds is looked at, and ended if its writer's
lease ran out, as ``aisdk.response`` does.

Every request is checked: the stream a method returns must be one the socket's user may read
(``PGSTREAMS['AUTHORIZE']``) and an ``application/json`` stream (each chunk one part's JSON,
as ``aisdk`` writes them); a frame that is not what the transport sends gets an ``error`` frame
for its ``requestId`` saying why, and nothing is started; one with no ``requestId`` to answer
(not JSON, binary, too large) closes the socket with 4400 and the reason. A client that takes no
frame for ``SEND_TIMEOUT`` seconds (the server's send waits while it reads nothing) is given up:
the consumer ends, and the server drops the socket.

Not here: which answer is a chat's latest and how an answer is started (the project's models and
tasks, in its subclass), calling models, and the plain consumer's flow control: the transport
sends no acks, so a client is paced by its socket alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from channels.generic.websocket import AsyncWebsocketConsumer
from django.core.exceptions import PermissionDenied

from . import aisdk, delivery, leases, metrics
from .auth import readable_stream
from .consumers import server_send
from .exceptions import ChunksPruned, StreamError, StreamNotFound
from .models import Stream
from .protocol import BAD_REQUEST
from .reader import Progress
from .reader import afollow as read_by_itself
from .types import StreamChunk, stream_uuid

logger = logging.getLogger("pgstreams.aisdk_ws")

SEND_TIMEOUT: Final = 10.0  # seconds a frame may wait for a client that reads nothing
# Of frames waiting for a slow client's socket, past which the fan hands a request back to read by
# itself, at the socket's pace (it sends a batch, up to a page, then waits for the socket).
OUTBOX_CHARS: Final = 1 << 20
MAX_ID: Final = 128  # characters of a requestId or a chat id
SPENT: Final = 4429  # the close code of a socket that has carried max_socket_chars
TRIGGERS: Final = ("submit-message", "regenerate-message")
FAILED_TEXT: Final = "The request failed."  # what a client is shown of an unexpected error


class RequestRefused(Exception):
    """Raised by ``start_answer`` or ``latest_answer``: the request's ``error`` frame says this
    exception's message, and nothing else happens."""


@dataclass(frozen=True)
class ChatRequest:
    """A ``send`` or ``resume`` frame, checked: what ``start_answer`` and ``latest_answer`` get.
    ``messages`` (a send's) are the chat's UI messages as the client holds them, each a dict
    with a ``role`` and a list of ``parts``; ``headers`` and ``body`` are what the transport's
    options and ``sendMessage``'s added (headers travel in the frame: a browser's WebSocket sends
    none of its own but the cookies)."""

    kind: Literal["send", "resume"]
    request_id: str
    chat_id: str
    headers: dict[str, str]
    body: dict[str, Any]
    metadata: Any = None
    trigger: str | None = None  # a send's: "submit-message" or "regenerate-message"
    message_id: str | None = None  # a send's: the message to regenerate, if any
    messages: list[dict[str, Any]] = field(default_factory=list)
    last_sequence: int | None = None  # a resume's: the last part the client has, if it says


class _Request:
    """One request of a socket, from its frame until its ``end`` (or abort, or the socket's
    close); at its answer's tail, a follower of the answer's fan (``delivery.Follower``)."""

    def __init__(self, consumer: ChatConsumer, request_id: str) -> None:
        self.consumer = consumer
        self.id = request_id
        self.head = '{"type":"chunk","requestId":' + json.dumps(request_id)  # its chunk frames' start
        self.task: asyncio.Task[None] | None = None
        self.found = False  # its method has returned
        self.stream_id: uuid.UUID | None = None  # once it is known to be an answer the user may read
        self.aborted = False
        self.position = 0  # the offset of the next part to send
        self.heard = False  # a part came since the last look at the answer's lease

    def take(self, progress: Progress) -> bool:
        """``delivery.Follower``: send a round's parts, without waiting; False once the socket is
        backed up (the fan hands the request back: it reads by itself when the socket drains)."""
        return self.consumer.send_parts(self, progress.chunks)


class ChatConsumer(AsyncWebsocketConsumer):
    """The endpoint of ``WebSocketChatTransport``: subclass it with ``start_answer`` and
    ``latest_answer``, and route the subclass (``path("ws/chat/", MyChat.as_asgi())``)."""

    stop_on_abort: bool = True  # an abort frame stops the answer (False: it only stops sending it)
    max_frame_chars: int = 4 << 20  # characters of a frame: a send frame carries the chat's messages
    max_requests: int = 16  # requests served at once on one socket
    # Characters of frames one socket carries in its life: past them it takes no new request and is
    # closed (SPENT); the transport opens another at its next. Under daphne a send never waits, so
    # this is what bounds the memory a client that reads nothing can make the server hold.
    max_socket_chars: int = 32 << 20

    async def start_answer(self, request: ChatRequest) -> Stream | uuid.UUID | str:
        """Start the answer to a ``send`` frame (``aisdk.start_generation``, with the project's
        record of the chat's turn, in one transaction) and return its stream. Raise
        ``RequestRefused`` to refuse it with a reason the client is shown."""
        raise NotImplementedError("a ChatConsumer subclass says how an answer starts: define start_answer()")

    async def latest_answer(self, request: ChatRequest) -> Stream | uuid.UUID | str | None:
        """The answer a ``resume`` frame of chat ``request.chat_id`` replays (the chat's latest,
        mostly, finished or not), or None: the client is told there is none (``no-active``)."""
        raise NotImplementedError("a ChatConsumer subclass says which answer resumes: define latest_answer()")

    # -- the socket -------------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.main = asyncio.current_task()
        self.serving: dict[str, _Request] = {}
        self.sending: asyncio.Task[None] | None = None  # a frame's send that had to wait
        self.outbox: deque[str] = deque()  # frames to send after it, in order
        self.outbox_chars = 0
        self.flowing = asyncio.Event()  # set while no frame waits to be sent
        self.flowing.set()
        self.took = asyncio.get_running_loop().time()  # when the client last took a frame, as far as a wait shows
        self.sent_chars = 0
        self.given_up = False  # or its socket broke or was closed: nothing more is sent
        self.abandoned = False  # given up by give_up(), which cancels the consumer
        try:
            await super().__call__(scope, receive, send)
        except asyncio.CancelledError:
            # Cancelled by give_up() alone: the consumer ends, as it meant to.
            if not self.abandoned or self.main.uncancel() > 0:
                raise
        finally:
            self.stop_serving()  # however it ended: no request of it is served on

    async def connect(self) -> None:
        self.send_raw = server_send(self.base_send)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        """The socket closed: its requests end; their answers go on being written."""
        self.stop_serving()

    def stop_serving(self) -> None:
        """End every request but those aborted while their method ran: they stop their answer
        once it has returned (``abort`` took out and ended the others)."""
        for serving in self.serving.values():
            if serving.aborted:
                continue
            if serving.task is not None and serving.task is not asyncio.current_task():
                serving.task.cancel()
        self.serving.clear()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.given_up:
            return
        if text_data is None:
            return await self.close_with(BAD_REQUEST, "binary frames are not accepted: send the transport's JSON")
        if len(text_data) > self.max_frame_chars:
            return await self.close_with(BAD_REQUEST, f"a frame is at most {self.max_frame_chars} characters")
        try:
            frame = json.loads(text_data)
        except (ValueError, RecursionError):
            return await self.close_with(BAD_REQUEST, "a frame is one JSON object, as WebSocketChatTransport sends")
        request_id = frame.get("requestId") if isinstance(frame, dict) else None
        if not _is_id(request_id):
            return await self.close_with(BAD_REQUEST, f"a frame has a requestId: {ID_RULE}")
        kind = frame.get("type")
        if kind == "abort":
            return await self.abort(request_id)
        if request_id in self.serving:
            return self.error(request_id, f"request {request_id!r} is being served already")
        try:
            request = _checked(frame, request_id)
        except ValueError as exc:
            return self.error(request_id, str(exc))
        if len(self.serving) >= self.max_requests:
            return self.error(request_id, f"at most {self.max_requests} requests at once")
        if self.sent_chars >= self.max_socket_chars:
            return await self.close_with(SPENT, "this socket has carried its share; open another")
        serving = self.serving[request_id] = _Request(self, request_id)
        serving.task = asyncio.create_task(self.serve(request, serving), name=f"pgstreams-aisdk-ws-{request_id}")

    async def abort(self, request_id: str) -> None:
        """The client stopped a request (``stop()``): no more frames for it, and its answer
        stopped for everyone if ``stop_on_abort``. A request that ended already is let be."""
        serving = self.serving.get(request_id)
        if serving is None or serving.aborted:
            return
        serving.aborted = True
        if not serving.found:
            return  # its method runs: it stays counted (and its id taken), and stops its answer after
        del self.serving[request_id]
        if serving.task is not None:
            serving.task.cancel()
        if serving.stream_id is not None:
            await self.stop_answer(serving.stream_id)

    async def stop_answer(self, stream_id: uuid.UUID) -> None:
        """Stop the answer for everyone (``stop_on_abort``), to its end even if this consumer is
        cancelled meanwhile (a server shutting down, a client given up): the abort was heard."""
        if not self.stop_on_abort:
            return
        stopping = asyncio.ensure_future(_stop(stream_id))
        _methods.add(stopping)
        stopping.add_done_callback(_methods.discard)
        try:
            await asyncio.shield(stopping)
        except asyncio.CancelledError:
            stopping.add_done_callback(_unheard)
            raise

    # -- one request ------------------------------------------------------------------------------

    async def serve(self, request: ChatRequest, serving: _Request) -> None:
        """Find or start the request's answer, check it may be read, and send it to its end. A
        request aborted while its method ran sends nothing, and stops what the method returned."""
        rid = request.request_id
        try:
            sid, stream = await self.answer_of(request)
            serving.found = True
            if sid is not None and aisdk.is_answer(stream):
                serving.stream_id = sid  # an answer the user may read: an abort may stop it from now on
            if serving.aborted:  # while its method ran
                if serving.stream_id is not None:
                    await self.stop_answer(serving.stream_id)
                return
            if sid is None:
                return self.frame({"type": "no-active", "requestId": rid})
            if stream.content_type != "application/json":
                raise RequestRefused("the answer's stream holds no UI message parts (it is not application/json)")
            start = 0 if request.last_sequence is None else request.last_sequence + 1
            if start > stream.next_offset:
                raise RequestRefused(f"lastSequence {request.last_sequence} is past the answer's end")
            serving.position = start
            self.frame({"type": "start", "requestId": rid})
            metrics.chat_requests.inc()
            try:
                await self.send_answer(serving, sid)
            finally:
                metrics.chat_requests.dec()
        except RequestRefused as exc:
            self.refused(serving, str(exc))
        except StreamNotFound:
            self.refused(serving, "The answer was deleted.")
        except ChunksPruned:
            self.refused(serving, "The answer's first parts were pruned.")
        except PermissionDenied:
            self.refused(serving, "not allowed to read this answer")
        except _GivenUp:
            return
        except Exception:
            logger.exception("pgstreams: a WebSocket chat request of chat %r failed", request.chat_id)
            self.refused(serving, FAILED_TEXT)
        finally:
            if self.serving.get(rid) is serving:
                del self.serving[rid]

    def refused(self, serving: _Request, text: str) -> None:
        if not serving.aborted:
            self.error(serving.id, text)

    async def answer_of(self, request: ChatRequest) -> tuple[uuid.UUID | None, Stream | None]:
        """The request's answer from the subclass's method, if the socket's user may read it. The
        method runs to its end if the socket closes meanwhile (a closed socket ends nothing: an
        answer being started is started)."""
        method = self.start_answer(request) if request.kind == "send" else self.latest_answer(request)
        running = asyncio.ensure_future(method)
        _methods.add(running)
        running.add_done_callback(_methods.discard)
        try:
            found = await asyncio.shield(running)
        except asyncio.CancelledError:
            running.add_done_callback(_unheard)  # no request takes its outcome now
            raise
        if found is None:
            if request.kind == "send":
                raise TypeError("start_answer() returned None: it returns the answer's stream")
            return None, None
        sid = found.pk if isinstance(found, Stream) else stream_uuid(found)
        return sid, await readable_stream(self.scope.get("user"), sid)

    async def send_answer(self, serving: _Request, sid: uuid.UUID) -> None:
        """A chunk frame a part from ``serving.position``, live as they commit, then ``end``:
        read by itself until it is at the answer's tail, then handed its parts by the answer's
        fan with every other reader at the tail in this process, until the fan hands it back (it
        is on its own again when the socket is backed up) or the answer ends."""
        while True:
            if await self.send_by_itself(serving, sid) is delivery.END:
                break
            if await self.follow_fan(serving, sid) is delivery.END:
                break
        self.frame({"type": "end", "requestId": serving.id})

    async def send_by_itself(self, serving: _Request, sid: uuid.UUID) -> object:
        """Read and send from ``serving.position``, at the socket's pace, until the tail (None)
        or the answer's end (``delivery.END``)."""
        batches = read_by_itself(sid, from_offset=serving.position, idle=aisdk.HEARTBEAT)
        async with contextlib.aclosing(batches):
            async for progress in batches:
                if progress.chunks:
                    self.send_parts(serving, progress.chunks)
                    await self.drained()
                elif not progress.closed:
                    await leases.aend_if_expired(sid)  # silent: is its writer alive?
                if progress.closed:
                    return delivery.END
                if progress.caught_up:
                    return None
        return delivery.END

    async def follow_fan(self, serving: _Request, sid: uuid.UUID) -> object:
        """Be handed the answer's parts by its fan until it hands the request back: None (it
        reads by itself again) or ``delivery.END``; looking at the answer's lease after each
        whole HEARTBEAT of silence."""
        handback = delivery.join(sid, serving)
        if handback is None:
            return None  # the fan is elsewhere in the answer
        try:
            while True:
                serving.heard = False
                done, _ = await asyncio.wait([handback], timeout=aisdk.HEARTBEAT)
                if done:
                    break
                if not serving.heard:
                    await leases.aend_if_expired(sid)
        finally:
            delivery.leave(sid, serving)
        why = handback.result()
        if isinstance(why, BaseException):
            raise delivery.reraised(why)
        return why

    # -- frames: sent in order, without waiting but for a backed-up socket -------------------------

    def send_parts(self, serving: _Request, chunks: list[StreamChunk]) -> bool:
        """Send each part in its chunk frame; False if the socket is backed up (or gone)."""
        for tail in delivery.shared("aisdk-ws", chunks, _tails):
            self.send_soon(serving.head + tail)
        serving.position = chunks[-1].offset + 1
        serving.heard = True
        return not self.given_up and self.outbox_chars < OUTBOX_CHARS

    def frame(self, frame: dict[str, Any]) -> None:
        self.send_soon(json.dumps(frame, separators=(",", ":")))

    def error(self, request_id: str, text: str) -> None:
        self.frame({"type": "error", "requestId": request_id, "errorText": text})

    def send_soon(self, text: str) -> None:
        """Send a frame now if none waits to be sent before it, else after them; never wait (a
        fan delivers to many sockets). After a send fails, nothing more is sent."""
        if self.given_up:
            return
        self.sent_chars += len(text)
        if self.sending is not None:
            self.outbox.append(text)
            self.outbox_chars += len(text)
            return
        self.start_sending(text)

    def start_sending(self, text: str) -> None:
        try:
            self.sending = delivery.start(self.send_raw({"type": "websocket.send", "text": text}))
        except Exception as exc:
            return self.send_failed(exc)
        if self.sending is None:
            return
        self.took = asyncio.get_running_loop().time()  # the one before it was taken at once
        self.flowing.clear()
        self.sending.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self.sending = None
        if task.cancelled() or task.exception() is not None:
            return self.send_failed(None if task.cancelled() else task.exception())
        self.took = asyncio.get_running_loop().time()
        while self.outbox and self.sending is None and not self.given_up:
            text = self.outbox.popleft()
            self.outbox_chars -= len(text)
            self.start_sending(text)
        if self.sending is None:
            self.flowing.set()

    def send_failed(self, error: BaseException | None) -> None:
        """A frame did not go out (the socket is going, mostly): send nothing more."""
        logger.debug("pgstreams: a WebSocket chat send failed: %r", error)
        self.given_up = True
        self.outbox.clear()
        self.flowing.set()
        self.stop_serving()

    async def drained(self) -> None:
        """Wait until no frame waits to be sent. A client that takes no frame for SEND_TIMEOUT
        seconds (the server's send waits while it reads nothing) is given up: the consumer ends."""
        loop = asyncio.get_running_loop()
        while not self.flowing.is_set():
            left = self.took + SEND_TIMEOUT - loop.time()
            if left <= 0:
                self.give_up()
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self.flowing.wait()
        if self.given_up:
            raise _GivenUp

    def give_up(self) -> None:
        """End the consumer without its client, once, holding nothing of it."""
        if self.given_up:
            return
        logger.info("pgstreams: a WebSocket chat client took no frame for %.0f s; giving it up", SEND_TIMEOUT)
        self.given_up = self.abandoned = True
        self.outbox.clear()
        self.flowing.set()
        self.main.cancel()

    async def close_with(self, code: int, reason: str) -> None:
        """Close the socket, saying why: a frame with no request to answer."""
        self.given_up = True
        self.stop_serving()
        await self.close(code=code, reason=reason[:120])


# Subclasses' methods and answers' stops running, which the loop holds only weakly: each goes on
# to its end if its request's task is cancelled.
_methods: set[asyncio.Future[Any]] = set()


async def _stop(stream_id: uuid.UUID) -> None:
    try:
        await aisdk.astop(stream_id, reason="stopped by the user")
    except StreamError:
        logger.exception("pgstreams: could not stop the answer in stream %s", stream_id)


class _GivenUp(Exception):
    """The socket's client was given up: its requests send nothing more."""


ID_RULE: Final = f"a string of 1 to {MAX_ID} characters, none of them NUL or a lone surrogate"


def _is_id(value: Any) -> bool:
    """Whether ``value`` is a requestId or chat id Postgres can hold (to look a chat up by it)."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID or "\x00" in value:
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _unheard(method: asyncio.Future[Any]) -> None:
    """Log what a subclass's method or a stop raised after its request ended (its socket closed)."""
    if not method.cancelled() and (error := method.exception()) is not None:
        logger.error("pgstreams: a WebSocket chat request's work failed after its socket closed", exc_info=error)


def _checked(frame: dict[str, Any], request_id: str) -> ChatRequest:
    """A send or resume frame as ``ChatRequest``; ValueError saying what is wrong with it."""
    kind = frame.get("type")
    if kind not in ("send", "resume"):
        raise ValueError(f"unknown frame type {kind!r:.40}: send, resume or abort")
    chat_id, headers, body = frame.get("id"), frame.get("headers", {}), frame.get("body", {})
    if not _is_id(chat_id):
        raise ValueError(f"a {kind} frame has an id: the chat's, {ID_RULE}")
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise ValueError("headers is an object of strings")
    if not isinstance(body, dict):
        raise ValueError("body is an object")
    common = {"request_id": request_id, "chat_id": chat_id, "headers": headers, "body": body}
    if kind == "resume":
        last = frame.get("lastSequence")
        if last is not None and (not isinstance(last, int) or isinstance(last, bool) or last < 0):
            raise ValueError("lastSequence is a whole number of 0 or more, or left out")
        return ChatRequest("resume", **common, metadata=frame.get("metadata"), last_sequence=last)
    trigger, message_id, messages = frame.get("trigger"), frame.get("messageId"), frame.get("messages")
    if trigger not in TRIGGERS:
        raise ValueError(f"trigger is one of {', '.join(TRIGGERS)}")
    if message_id is not None and not isinstance(message_id, str):
        raise ValueError("messageId is a string, or left out")
    if not isinstance(messages, list) or not all(_is_message(m) for m in messages):
        raise ValueError("messages is a list of UI messages, each an object with a role and a list of parts")
    return ChatRequest(
        "send", **common, metadata=frame.get("metadata"), trigger=trigger, message_id=message_id, messages=messages
    )


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("role"), str) and isinstance(value.get("parts"), list)


def _tails(chunks: Sequence[StreamChunk]) -> list[str]:
    """What follows a chunk frame's requestId, a part each: the same for every request."""
    return [f',"sequence":{chunk.offset},"chunk":{chunk.data}}}' for chunk in chunks]
