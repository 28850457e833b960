"""The AI SDK's UI message stream (npm ``ai``: ``useChat``, its ``Chat`` and
``DefaultChatTransport``) written to and served from pgstreams streams: one stream per answer,
one chunk per part (its JSON), so an answer is durable, read by any process, and readable by the
WebSocket, SSE and Durable Streams endpoints and in the admin too.

``create_answer`` makes an answer's stream; ``write_answer`` (or ``start_answer``, in a task of
the running loop) turns what a model yields (text deltas, or whole parts) into the parts of one
assistant message on the append path, and ends it with ``finish`` (or ``error``, if the source
raised) in the same transaction as the stream's close. ``stop`` ends an answer from any process
with ``abort``; the writer stops its source at its next part. Both ends are appends that close, so
exactly one of them lands, and a stop for an answer that ended does nothing. ``response`` serves
an answer as the SDK's client reads it: every part from the first (the client treats a resumed
answer as a replay from its ``start``, and replaces the message with that id, so nothing is
shown twice), the live ones as they commit, then ``[DONE]`` at the close.

An answer is leased from its creation for the time it may wait for its writer
(``create_answer``'s ``queue_timeout``, ``QUEUE_TIMEOUT`` by default: minutes, for a task queue
or a pool), to end with an ``error`` part saying that no writer started it. A writer takes the
answer when it starts: its lease is then ``LEASE`` seconds, renewed a third of it apart, to end
with an ``error`` part saying that the writer stopped. A response that finds the answer it
follows silent and past its lease ends it with that part, as the Durable Streams endpoint's live
reads do. A response at its answer's tail counts silence in whole intervals (``delivery``),
so a generation whose process died leaves no client of ``response`` waiting more than ``LEASE`` +
2 x ``HEARTBEAT`` seconds after its last renewal (one of the Durable Streams endpoint, ``LEASE`` +
twice its keep-alive interval), and an answer no writer took, no more than its queue timeout + 2 x
``HEARTBEAT`` after its creation. An answer made with ``start_generation`` is a generation
(``generations``): its task writes it with ``generate``, and its readers leave it, past its lease,
to another run of the task, which goes on in the same message.

Not here: conversations and which answer is a chat's latest (the project's models, as in the
SDK's own examples), calling models, and who may read an answer (the project's view decides
before it calls ``response``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Literal

from django.http import StreamingHttpResponse

from . import appends, conf, delivery, generations, leases, protocol, threads
from .exceptions import ChunksPruned, ProducerFenced, StreamClosed, StreamNotFound
from .models import Stream
from .types import StreamChunk, stream_uuid
from .writer import create_stream

logger = logging.getLogger("pgstreams.aisdk")

# What the SDK's own server helpers send with a UI message stream (less the hop-by-hop
# Connection header, which ASGI servers set themselves).
HEADERS: Final = {"x-vercel-ai-ui-message-stream": "v1", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
LEASE: Final = 10.0  # seconds a started answer is kept for its writer without a renewal
QUEUE_TIMEOUT: Final = 600.0  # seconds a created answer is kept for its writer to start, by default
HEARTBEAT: Final = 5.0  # seconds of silence after which a response sends a comment and looks at the lease
ERROR_TEXT: Final = "The answer failed."  # what a client is shown: the exception stays in the server's log
ABANDONED_TEXT: Final = "The answer's writer stopped before it finished."
NOT_STARTED_TEXT: Final = "No writer started the answer in time."
ANSWER_KEY: Final = "pgstreams_answer"  # in an answer's metadata: true

Ending = Literal["finish", "error", "stopped"]

_DONE: Final = b"data: [DONE]\n\n"
_answering: set[asyncio.Task[Ending]] = set()  # start_answer's tasks, which the loop holds only weakly
_LINE_END: Final = re.compile(r"\r\n|\r|\n")


def part(kind: str, **fields: Any) -> str:
    """One UI message part (``{"type": kind, ...fields}``) as the chunk that stores it."""
    return json.dumps({"type": kind, **fields}, separators=(",", ":"), ensure_ascii=False)


def message_id(stream_id: Any) -> str:
    """The id of the message an answer's stream holds (its ``start`` part's ``messageId``)."""
    return f"msg-{stream_uuid(stream_id).hex}"


def _abandoned() -> str:
    return part("error", errorText=ABANDONED_TEXT)


def create_answer(*, queue_timeout: float | None = None, using: str | None = None, **fields: Any) -> Stream:
    """``create_stream(**fields)`` for an answer: an ``application/json`` stream (a part per
    chunk, so that the Durable Streams endpoint serves it, with a ``path``, to
    ``@durable-streams/aisdk-transport`` as it is), leased for its writer to start.

    Args:
        queue_timeout: seconds the answer may wait for its writer (QUEUE_TIMEOUT if None): give
            it the longest wait the project's task queue or pool may make. If no writer has
            started it by then, its readers end it with an ``error`` part (NOT_STARTED_TEXT).
            Once a writer starts, the lease is LEASE, renewed while it writes.
    """
    seconds = QUEUE_TIMEOUT if queue_timeout is None else queue_timeout
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"queue_timeout is a number of seconds above 0, not {queue_timeout!r}")
    stream = create_stream(using=using, **_answer_fields(fields))
    leases.renew(stream.id, seconds, part("error", errorText=NOT_STARTED_TEXT), using=using)
    return stream


async def acreate_answer(*, queue_timeout: float | None = None, using: str | None = None, **fields: Any) -> Stream:
    """``create_answer()`` for async code."""
    return await _create_answer_async(queue_timeout=queue_timeout, using=using, **fields)


def start_answer(
    stream_id: Any, source: AsyncIterable[str | Mapping[str, Any]], *, using: str | None = None
) -> asyncio.Task[Ending]:
    """``write_answer()`` in a task of the running event loop, kept until it ends: a view that
    starts an answer and returns ``response()`` can end (its client reloads) while the answer
    goes on being written."""
    task = asyncio.get_running_loop().create_task(
        write_answer(stream_id, source, using=using), name=f"pgstreams-aisdk-answer-{stream_uuid(stream_id)}"
    )
    _answering.add(task)
    task.add_done_callback(_answering.discard)
    return task


async def write_answer(
    stream_id: Any, source: AsyncIterable[str | Mapping[str, Any]], *, using: str | None = None
) -> Ending:
    """Write the assistant message ``source`` yields to an open stream, and close it.

    ``source`` yields text deltas (``str``), which become one text part, or whole UI message
    parts (mappings with a ``type``: ``reasoning-*``, ``data-*``, tool parts...), stored as
    they are. The message starts with ``start`` (its id ``message_id(stream_id)``) and
    ``start-step``; it ends with ``finish-step`` and ``finish``, or with ``error`` if
    ``source`` raised (logged here; the client is shown ERROR_TEXT). Chunks go through a
    ``stream_writer``, so a part costs no wait for its commit.

    Starting takes the answer: its lease, until now the time it may wait for a writer, is LEASE
    from here, renewed a third of it apart until the answer ends.

    Returns how it ended: "finish", "error", or "stopped" if the stream was closed meanwhile
    (``stop``, or a reader that found its lease run out): then ``source`` is closed at its next
    part and nothing more is written.
    """
    sid = stream_uuid(stream_id)
    alias = using or conf.database()
    ending: Ending = "finish"
    lease: asyncio.Task[None] | None = None
    try:
        await leases.arenew(sid, LEASE, _abandoned(), using=alias)  # taken: the lease counts from here
        lease = asyncio.create_task(_keep_lease(sid, alias), name=f"pgstreams-aisdk-lease-{sid}")
        async with appends.stream_writer(sid, using=alias) as writer:
            await writer.send(part("start", messageId=message_id(sid)))
            await writer.send(part("start-step"))
            text: str | None = None  # the open text part's id
            parts = 0
            try:
                async for item in source:
                    if isinstance(item, str):
                        if text is None:
                            parts += 1
                            text = f"text-{parts}"
                            await writer.send(part("text-start", id=text))
                        await writer.send(part("text-delta", id=text, delta=item))
                        continue
                    if text is not None:
                        await writer.send(part("text-end", id=text))
                        text = None
                    await writer.send(_given_part(item))
            except StreamClosed:
                raise
            except Exception:
                logger.exception("pgstreams: the source of the answer in stream %s failed", sid)
                ending = "error"
            if text is not None:
                await writer.send(part("text-end", id=text))
            await writer.send(part("finish-step"))
        last = part("finish") if ending == "finish" else part("error", errorText=ERROR_TEXT)
        await appends.aappend(sid, last, close=True, using=alias)
        return ending
    except StreamClosed:
        return "stopped"
    finally:
        if lease is not None:
            lease.cancel()
        if hasattr(source, "aclose"):
            await source.aclose()


def start_generation(task: Any, *args: Any, stream: dict[str, Any] | None = None, **options: Any) -> Stream:
    """``generations.start()`` for an answer: an ``application/json`` stream (``stream`` holds
    ``create_stream()``'s other arguments) whose ``task`` writes it with ``generate()``, ended
    with an ``error`` part (ABANDONED_TEXT) if every attempt fails. ``options``: ``start()``'s
    attempts, lease, queue_timeout and using, and the task's keyword arguments."""
    return generations.start(task, *args, last=_abandoned(), stream=_answer_fields(stream or {}), **options)


def generate(stream_id: Any, source: Callable[[str], Iterable[str]], *, using: str | None = None) -> Ending:
    """In a generation's task: take the answer (``generations.take``) and write what
    ``source(text)`` yields, text deltas, as its one assistant message, going on from ``text``,
    the message's text as earlier runs left it ("" on the first), in the same text part; then
    end it with ``finish``, or with ``error`` (in one append, so that a run that takes it over
    never finishes an answer whose source failed) if ``source`` raised.

    Returns how it ended; "stopped" when the answer was closed (``stop``, or out of attempts)
    or a later run took it: then nothing more is written."""
    sid = stream_uuid(stream_id)
    try:
        with generations.take(sid, using=using) as taken:
            kinds, text, text_id = _written([json.loads(chunk) for chunk in taken.chunks])
            if "start" not in kinds:
                taken.write(part("start", messageId=message_id(sid)))
            if "start-step" not in kinds:
                taken.write(part("start-step"))
            if "text-start" not in kinds:  # else the source ran to its end (text-end) or goes on
                text_id = "text-1"
                taken.write(part("text-start", id=text_id))
            if text_id is not None:
                try:
                    for delta in source(text):
                        taken.write(part("text-delta", id=text_id, delta=delta))
                except (StreamClosed, ProducerFenced):
                    raise
                except Exception:
                    logger.exception("pgstreams: the source of the answer in stream %s failed", sid)
                    taken.close(part("error", errorText=ERROR_TEXT))
                    return "error"
                taken.write(part("text-end", id=text_id))
            if "finish-step" not in kinds:
                taken.write(part("finish-step"))
            taken.close(part("finish"))
            return "finish"
    except (StreamClosed, ProducerFenced):
        return "stopped"


def _written(parts: list[dict[str, Any]]) -> tuple[list[str], str, str | None]:
    """What earlier runs wrote of a message: its parts' kinds, its text, and its open text part."""
    text, text_id = "", None
    for item in parts:
        if item["type"] == "text-start":
            text_id = item["id"]
        elif item["type"] == "text-delta":
            text += item["delta"]
        elif item["type"] == "text-end":
            text_id = None
    return [item["type"] for item in parts], text, text_id


def is_answer(stream: Stream) -> bool:
    """Whether ``stream`` was made as an answer (``create_answer``, ``start_generation``)."""
    return stream.content_type == "application/json" and (stream.metadata or {}).get(ANSWER_KEY) is True


def _answer_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``create_stream()``'s arguments for an answer: JSON parts, marked in the metadata."""
    metadata = fields.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ValueError(f"metadata is a dict, not {type(metadata).__name__}")
    return {"content_type": "application/json", **fields, "metadata": {**metadata, ANSWER_KEY: True}}


def stop(stream_id: Any, *, reason: str | None = None, using: str | None = None) -> bool:
    """End an answer with an ``abort`` part, from any process: True if this stopped it, False
    if it had ended already (by ``finish``, ``error`` or another stop; nothing is written).
    Raises StreamNotFound for a stream that does not exist."""
    try:
        appends.append(stream_id, _abort(reason), close=True, using=using)
    except StreamClosed:
        return False
    return True


async def astop(stream_id: Any, *, reason: str | None = None, using: str | None = None) -> bool:
    """``stop()`` for async code."""
    try:
        await appends.aappend(stream_id, _abort(reason), close=True, using=using)
    except StreamClosed:
        return False
    return True


def response(stream_id: Any, *, using: str | None = None) -> StreamingHttpResponse:
    """The answer in a stream as the SDK's UI message stream over SSE: every part from the first,
    then each as it commits, then ``[DONE]`` at the stream's close. The caller has checked that
    the request may read it."""
    sid = stream_uuid(stream_id)
    body = delivery.ending_on_error(_events(sid, using or conf.database()), f"the answer in stream {sid}", _failed)
    reply = StreamingHttpResponse(body, content_type="text/event-stream")
    for header, value in HEADERS.items():
        reply[header] = value
    return reply


async def _events(sid: uuid.UUID, alias: str) -> AsyncIterator[bytes]:
    try:
        async with contextlib.aclosing(delivery.afollow(sid, from_offset=0, idle=HEARTBEAT)) as batches:
            async for progress in batches:
                if progress.chunks:
                    yield delivery.shared("aisdk", progress.chunks, _sse_data)
                    continue
                yield protocol.SSE_KEEPALIVE
                await leases.aend_if_expired(sid, using=alias)
    except StreamNotFound:
        yield _sse_part(part("error", errorText="The answer was deleted."))
    except ChunksPruned:
        yield _sse_part(part("error", errorText="The answer's first parts were pruned."))
    yield _DONE


def _failed(error: Exception) -> bytes:
    """The end of an answer whose reading failed: an error part the page shows (reloaded, it
    resumes the answer), then the stream's end."""
    return _sse_part(part("error", errorText="The answer could not be read on; reload to resume it.")) + _DONE


def _sse_data(chunks: Sequence[StreamChunk]) -> bytes:
    return "".join(_sse_event(chunk.data) for chunk in chunks).encode()


def _sse_event(data: str) -> str:
    if "\n" not in data and "\r" not in data:
        return f"data: {data}\n\n"
    return "".join(f"data: {line}\n" for line in _LINE_END.split(data)) + "\n"  # rejoined by the client


def _sse_part(data: str) -> bytes:
    return _sse_event(data).encode()


def _given_part(item: Mapping[str, Any]) -> str:
    kind = item.get("type") if isinstance(item, Mapping) else None
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"an answer's source yields text (str) or parts (mappings with a 'type'), not {item!r:.80}")
    return json.dumps(item, separators=(",", ":"), ensure_ascii=False)


def _abort(reason: str | None) -> str:
    return part("abort", reason=reason) if reason is not None else part("abort")


_create_answer_async = threads.writes.wrap(create_answer)


async def _keep_lease(sid: uuid.UUID, alias: str) -> None:
    """Renew the lease its writer took until cancelled; a renewal that fails is logged and tried
    again."""
    while True:
        await asyncio.sleep(LEASE / 3)
        try:
            await leases.arenew(sid, LEASE, _abandoned(), using=alias)
        except Exception:
            logger.exception("pgstreams: could not renew the lease of the answer in stream %s", sid)
