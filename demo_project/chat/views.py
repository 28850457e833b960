"""The chat pages: the list of conversations with a prompt box, and one conversation."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods

import pgstreams

from . import llm
from .models import Conversation

MAX_PROMPT = 2000


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
        else:
            with transaction.atomic():
                stream = pgstreams.create_stream(owner=request.user, label=prompt[:200])
                conversation = Conversation.objects.create(user=request.user, prompt=prompt, stream=stream)
                transaction.on_commit(lambda: llm.start(stream.id, prompt))
            return redirect("chat:conversation", pk=conversation.pk)
    conversations = Conversation.objects.filter(user=request.user).select_related("stream")[:50]
    return render(request, "chat/index.html", {"conversations": conversations, "error": error})


@login_required
def conversation(request: HttpRequest, pk: int) -> HttpResponse:
    turn = get_object_or_404(Conversation.objects.select_related("stream"), pk=pk, user=request.user)
    return render(request, "chat/conversation.html", {"turn": turn})
