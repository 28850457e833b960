"""More answers than the demo's pool has model workers, at a model's pace: the one that waits for a
worker is neither taken over nor ended meanwhile. A module of its own: no other module's demo
(whose workers, on the same test database, would take these answers at another pace) runs while
its workers do."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.test import AsyncClient

from demo_project.chat import llm
from demo_project.chat.models import Conversation
from tests.helpers import Workers, worker_processes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess]

PROMPT = "Why does a NOTIFY per write not scale?"


@pytest.mark.slow
async def test_more_answers_than_the_demo_has_workers_all_finish_at_a_models_pace() -> None:
    """Three prompts to the demo's endpoint with two model workers at 8 tokens/s: one answer
    waits about 7 to 12 s for a worker, longer than the lease its worker then keeps (views.LEASE), and
    is neither taken over nor ended meanwhile."""
    prompts = ["What happens on reconnect?", PROMPT, "Which servers?"]  # 95, 99, then 59 tokens
    user = await sync_to_async(get_user_model().objects.create_user)("queued", password="pw")
    client = AsyncClient()
    await client.aforce_login(user)

    async def ask(prompt: str) -> Any:  # in this order: each answer's task is enqueued as it is asked
        body = {"id": "queued", "messages": [{"role": "user", "parts": [{"type": "text", "text": prompt}]}]}
        reply = await client.post("/ai/chat", json.dumps(body), content_type="application/json")
        assert reply.status_code == 200
        return reply

    async def read(reply: Any) -> tuple[list[dict[str, Any]], float]:
        text = b"".join([piece async for piece in reply.streaming_content]).decode()
        events = [e.removeprefix("data: ") for e in text.split("\n\n") if e and not e.startswith(":")]
        assert events[-1] == "[DONE]"
        return [json.loads(e) for e in events[:-1]], time.monotonic() - asked

    workers = await asyncio.to_thread(Workers, 2, env={"CHAT_TOKENS_PER_SECOND": "8"})
    try:
        assert set(worker_processes()) == set(workers.processes), "another pool's workers would take these answers"
        asked = time.monotonic()
        replies = [await ask(prompt) for prompt in prompts]
        results = await asyncio.gather(*(read(reply) for reply in replies))
    finally:
        await asyncio.to_thread(workers.stop)
    for prompt, (answer, took) in zip(prompts, results, strict=True):
        print(f"{len(llm.answer(prompt))} tokens, ended with {answer[-1]['type']} {took:.1f} s after it was asked")
    for prompt, (answer, _) in zip(prompts, results, strict=True):
        assert [p["type"] for p in answer][-1] == "finish", (prompt, answer[-1])
        assert "error" not in [p["type"] for p in answer]
        assert "".join(p["delta"] for p in answer if p["type"] == "text-delta") == "".join(llm.answer(prompt))
    assert max(took for _, took in results) > 15  # one waited for a worker
    turns = Conversation.objects.filter(chat_id="queued").select_related("stream")
    attempts = await sync_to_async(lambda: [t.stream.metadata["pgstreams_generation"]["attempt"] for t in turns])()
    assert attempts == [1, 1, 1]  # none taken over while it waited
