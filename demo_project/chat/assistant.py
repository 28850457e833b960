"""The chat through the AI SDK's ``useChat``: its page (``ai/`` makes a new chat, ``ai/c/<id>/``
shows one, several prompts and answers), and the endpoints ``DefaultChatTransport`` talks to with
``api`` set to ``ai/chat``: a POST of the chat's messages starts an answer and streams it, the GET
of ``ai/chat/<id>/stream`` resumes the chat's latest answer (204 if it has none), and a POST to
``ai/chat/<id>/stop`` ends the answer being written. ``ai/durable/chat`` is the same for
``@durable-streams/aisdk-transport``: its POST and GET answer where the Durable Streams endpoint
serves the answer. Each prompt is a ``Conversation`` of the chat, its answer a generation written
by a worker (``tasks.answer_parts``): ``new_turn``, which the chat socket (``sockets``, ai 7's
``WebSocketChatTransport``, the page's default) starts its answers with too."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from pgstreams import StreamError, aisdk, leases
from pgstreams.models import Chunk

from . import tasks
from .models import Conversation
from .views import LEASE, MAX_PROMPT, unstorable

CHAT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
SDK_TRANSPORTS = {("7", "websocket"), ("7", "http"), ("6", "http")}  # (the ai major, the page's transport)


@login_required
def new_page(request: HttpRequest) -> HttpResponse:
    """A new chat: its id made here, as ``useChat`` would make one (the page's options kept)."""
    url = reverse("chat:ai_page", kwargs={"chat_id": uuid.uuid4().hex[:16]})
    return redirect(f"{url}?{request.GET.urlencode()}" if request.GET else url)


@login_required
def page(request: HttpRequest, chat_id: str) -> HttpResponse:
    """The chat's page (``node/aisdk_page.jsx``, bundled): its earlier turns, each prompt and
    each answer's stored parts; the latest answer's parts are left to ``useChat``, which resumes
    it. ``?sdk=6`` runs it on ai 6 (default 7); ``?transport=http`` over the HTTP endpoints
    (default ``websocket``, the chat socket; ai 6 has only ``http``)."""
    if not CHAT_ID.fullmatch(chat_id):
        raise Http404("no such chat")
    sdk = request.GET.get("sdk", "7")
    transport = request.GET.get("transport", "websocket" if sdk == "7" else "http")
    if (sdk, transport) not in SDK_TRANSPORTS:
        raise Http404(f"the page runs ai 7 over websocket or http, or ai 6 over http; not ai {sdk} over {transport}")
    turns = list(Conversation.objects.filter(user=request.user, chat_id=chat_id).order_by("created_at"))
    stored: dict[uuid.UUID, list[Any]] = {turn.stream_id: [] for turn in turns[:-1]}
    for stream_id, data in (
        Chunk.objects.filter(stream_id__in=stored).order_by("stream_id", "offset").values_list("stream_id", "data")
    ):
        stored[stream_id].append(json.loads(data))
    history: list[dict[str, Any]] = []
    for turn in turns:
        history.append({"id": f"prompt-{turn.pk}", "role": "user", "parts": [{"type": "text", "text": turn.prompt}]})
        if turn.stream_id in stored:
            history.append({"role": "assistant", "parts": stored[turn.stream_id]})
    script = "chat/vendor/aisdk-chat.js" if sdk == "7" else "chat/vendor/aisdk-chat-6.js"
    context = {"chat_id": chat_id, "history": history, "sdk": sdk, "transport": transport, "script": script}
    return render(request, "chat/ai.html", context)


@login_required
@require_POST
async def chat(request: HttpRequest) -> HttpResponseBase:
    """``sendMessages``: the body is ``{"id": chat id, "messages": [...], ...}``; the prompt is
    the text of the last message, which must be the user's."""
    turn = await _start(request)
    return turn if isinstance(turn, HttpResponse) else aisdk.response(turn.stream_id)


@login_required
@require_GET
async def resume(request: HttpRequest, chat_id: str) -> HttpResponseBase:
    """``reconnectToStream``: the chat's latest answer from its first part, live to its end."""
    turn = await _latest(request, chat_id)
    return HttpResponse(status=204) if turn is None else aisdk.response(turn.stream_id)


@login_required
@require_POST
async def durable_chat(request: HttpRequest) -> HttpResponseBase:
    """``sendMessages`` of ``@durable-streams/aisdk-transport``: where the answer can be read."""
    turn = await _start(request)
    return turn if isinstance(turn, HttpResponse) else _pointer(turn, 201)


@login_required
@require_GET
async def durable_resume(request: HttpRequest, chat_id: str) -> HttpResponse:
    """Its ``reconnectToStream``: where the chat's latest answer can be read (ended first if its
    writer's lease ran out, rather than after the endpoint's first silence)."""
    turn = await _latest(request, chat_id)
    if turn is None:
        return HttpResponse(status=204)
    await leases.aend_if_expired(turn.stream_id)
    return _pointer(turn, 200)


@login_required
@require_POST
async def stop(request: HttpRequest, chat_id: str) -> JsonResponse:
    """End the chat's latest answer with an ``abort`` part, if it is still being written; with
    ``{"messageId": ...}`` only if that answer is still the latest."""
    turn = await _latest(request, chat_id)
    given = _json(request).get("messageId")
    if turn is None or (given is not None and given != aisdk.message_id(turn.stream_id)):
        return JsonResponse({"stopped": False})
    try:
        stopped = await aisdk.astop(turn.stream_id, reason="stopped by the user")
    except StreamError as exc:  # not known to be stopped (a failover, say): the client may try again
        return JsonResponse({"stopped": False, "error": f"the answer could not be stopped now: {exc}"}, status=503)
    return JsonResponse({"stopped": stopped})


async def _start(request: HttpRequest) -> Conversation | HttpResponse:
    """The prompt's turn, its answer started; or the 400 that refuses the request."""
    try:
        body = _loads(request.body)
        chat_id, messages = body["id"], body["messages"]
    except (ValueError, KeyError, TypeError):
        return _refused('the body must be JSON with "id" and "messages", as the AI SDK sends it')
    try:
        prompt = checked_prompt(chat_id, messages)
    except ValueError as exc:
        return _refused(str(exc))
    return await sync_to_async(new_turn)(await request.auser(), chat_id, prompt)


def checked_prompt(chat_id: Any, messages: Any) -> str:
    """The prompt of a request to start an answer: the text of the last message, which must be
    the user's. ValueError saying why a request is refused."""
    if not isinstance(chat_id, str) or not CHAT_ID.fullmatch(chat_id):
        raise ValueError("a chat id is 1 to 64 letters, digits, '_' or '-'")
    prompt = _prompt(messages)
    if not prompt:
        raise ValueError("the last message must be the user's, with text")
    if len(prompt) > MAX_PROMPT:
        raise ValueError(f"prompts are at most {MAX_PROMPT} characters")
    if problem := unstorable(prompt):
        raise ValueError(f"the prompt {problem}")
    return prompt


def new_turn(user: Any, chat_id: str, prompt: str) -> Conversation:
    """The prompt's turn of the chat, its answer started as a generation, in one transaction."""
    with transaction.atomic():
        # A path too: @durable-streams/aisdk-transport reads the answer there.
        stream = aisdk.start_generation(
            tasks.answer_parts,
            prompt,
            lease=LEASE,
            stream={"owner": user, "label": prompt[:200], "path": f"chat/{uuid.uuid4().hex}"},
        )
        turn = Conversation.objects.create(user=user, prompt=prompt, stream=stream, chat_id=chat_id)
    return turn


async def _latest(request: HttpRequest, chat_id: str) -> Conversation | None:
    return await latest_turn(await request.auser(), chat_id)


async def latest_turn(user: Any, chat_id: str) -> Conversation | None:
    """The user's latest turn of the chat, if any."""
    turns = Conversation.objects.filter(user=user, chat_id=chat_id).select_related("stream")
    return await turns.order_by("-created_at").afirst()


def _pointer(turn: Conversation, status: int) -> JsonResponse:
    url = reverse("pgstreams:durable-stream", kwargs={"path": turn.stream.path})
    response = JsonResponse({"streamUrl": url}, status=status)
    response["Location"] = url
    response["Cache-Control"] = "no-store"
    return response


def _prompt(messages: Any) -> str:
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return ""
    last = messages[-1]
    if last.get("role") != "user" or not isinstance(last.get("parts"), list):
        return ""
    texts = [p.get("text") for p in last["parts"] if isinstance(p, dict) and p.get("type") == "text"]
    return "".join(t for t in texts if isinstance(t, str)).strip()


def _json(request: HttpRequest) -> dict[str, Any]:
    try:
        body = _loads(request.body or b"{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _loads(body: bytes) -> Any:
    """A body's JSON; ValueError for one that is not, or is nested too deeply to parse."""
    try:
        return json.loads(body)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def _refused(message: str) -> HttpResponse:
    return HttpResponse(f"{message}\n", status=400, content_type="text/plain; charset=utf-8")
