"""The chat pages: the list of conversations with a prompt box, one conversation (with its stop
button, and whether it was stopped), and the same answer read by the official Durable Streams
client."""

from __future__ import annotations

import uuid

from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

import pgstreams
from pgstreams import generations
from pgstreams.models import Stream

from . import tasks
from .models import Conversation

MAX_PROMPT = 2000
# Seconds a worker may go silent before its answer is taken over: short, so that killing a worker
# shows the answer going on within a few seconds (a deployment keeps generations.LEASE, 10 s).
LEASE = 3.0


def unstorable(text: str) -> str | None:
    """What keeps Postgres from storing ``text``, if anything: a NUL character (which no text
    column holds, as Django's forms say too) or a lone surrogate (no UTF-8)."""
    if "\x00" in text:
        return "holds a NUL character, which cannot be stored; remove it"
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            return "holds a lone surrogate, which is not text; remove it"
    return None


@login_required
@require_http_methods(["GET", "POST"])
def index(request: HttpRequest) -> HttpResponse:
    error = ""
    if request.method == "POST":
        prompt = request.POST.get("prompt", "").strip()
        if not prompt:
            error = "Type a prompt first."
        elif len(prompt) > MAX_PROMPT:
            error = f"Prompts are at most {MAX_PROMPT} characters."
        elif problem := unstorable(prompt):
            error = f"The prompt {problem}."
        else:
            with transaction.atomic():
                # The answer's stream and the task that writes it; a path too: the official
                # Durable Streams client reads the answer there.
                stream = generations.start(
                    tasks.answer_tokens,
                    prompt,
                    last=tasks.LOST,
                    lease=LEASE,
                    stream={"owner": request.user, "label": prompt[:200], "path": f"chat/{uuid.uuid4().hex}"},
                )
                conversation = Conversation.objects.create(user=request.user, prompt=prompt, stream=stream)
            return redirect("chat:conversation", pk=conversation.pk)
    conversations = Conversation.objects.filter(user=request.user).select_related("stream")[:50]
    return render(request, "chat/index.html", {"conversations": conversations, "error": error})


def _turn(request: HttpRequest, pk: int) -> Conversation:
    return get_object_or_404(Conversation.objects.select_related("stream"), pk=pk, user=request.user)


@login_required
def conversation(request: HttpRequest, pk: int) -> HttpResponse:
    return render(request, "chat/conversation.html", {"turn": _turn(request, pk)})


@login_required
def official_client(request: HttpRequest, pk: int) -> HttpResponse:
    return render(request, "chat/official_client.html", {"turn": _turn(request, pk)})


@login_required
def htmx(request: HttpRequest, pk: int, major: int = 4) -> HttpResponse:
    """The answer followed by htmx 4 (its hx-sse extension), or with ``major=2`` by htmx 2 (htmx-ext-sse)."""
    return render(request, "chat/htmx.html", {"turn": _turn(request, pk), "major": major})


@login_required
@require_POST
def stop(request: HttpRequest, pk: int) -> JsonResponse:
    """Close the answer's stream, noting in the stream that it was stopped: every reader sees the
    end at once, and the generator's next append is refused, which stops it."""
    turn = _turn(request, pk)
    with transaction.atomic():
        try:
            pgstreams.close(turn.stream_id)
        except pgstreams.StreamClosed:  # it had ended already
            return JsonResponse(_state(turn.stream_id))
        stream = Stream.objects.select_for_update().get(pk=turn.stream_id)
        stream.metadata = {**stream.metadata, "stopped": True}
        stream.save(update_fields=["metadata"])
    return JsonResponse(_state(turn.stream_id))


@login_required
def state(request: HttpRequest, pk: int) -> JsonResponse:
    """Whether the answer is still being written, and whether it was stopped."""
    return JsonResponse(_state(_turn(request, pk).stream_id))


def _state(stream_id: uuid.UUID) -> dict[str, bool]:
    stream = Stream.objects.get(pk=stream_id)
    return {"closed": stream.is_closed, "stopped": bool(stream.metadata.get("stopped"))}
