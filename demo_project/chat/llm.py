"""A fake LLM: a deterministic answer for each prompt, appended token by token to a stream by a
background worker in the server process (``pgstreams.append``: the tokens of every answer being
written commit together, in batches), or written as the AI SDK's message parts
(``pgstreams.aisdk.write_answer``). No network and no model."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db import close_old_connections

import pgstreams
from pgstreams import aisdk

logger = logging.getLogger("demo_project.chat")

_SENTENCES = (
    "Every chunk is a row in Postgres, so nothing is lost when a browser reconnects.",
    "A reader that comes back asks for the offsets it missed and gets each one exactly once.",
    "A notification is only a nudge to read the table, never the data itself.",
    "Writers commit at full speed, because the lock behind NOTIFY is taken once per flush.",
    "A slow poll, once a second per process, covers any nudge that was lost.",
    "One listener per process serves every reader in it, sync or async.",
    "Offsets come from the stream's own counter, so they stay gap-free even after a rollback.",
    "Several server processes can follow the same stream, each with a single LISTEN connection.",
    "Streaming tokens to a browser needs no broker beyond the database you already run.",
    "The WebSocket sends whatever is ready in one frame, and the client acknowledges it.",
)

_executor: ThreadPoolExecutor | None = None


def answer(prompt: str) -> list[str]:
    """The tokens of the answer to ``prompt``: the same prompt always gets the same answer."""
    rng = random.Random(hashlib.sha256(prompt.encode()).digest())
    topic = " ".join(prompt.split()[:12]) or "nothing"
    sentences = [f"You asked: \u201c{topic}\u201d."] + rng.sample(_SENTENCES, rng.randint(4, 6))
    words = " ".join(sentences).split(" ")
    return [words[0]] + [" " + word for word in words[1:]]


def generate(stream_id: uuid.UUID, prompt: str) -> None:
    """Write the answer at ``CHAT_TOKENS_PER_SECOND``, then close the stream."""
    pause = 1 / getattr(settings, "CHAT_TOKENS_PER_SECOND", 30)
    try:
        for token in answer(prompt):
            pgstreams.append(stream_id, token)
            time.sleep(pause)
        pgstreams.close(stream_id)
    except pgstreams.StreamError as exc:  # deleted or closed meanwhile: stop writing
        logger.info("stopped answering into stream %s: %s", stream_id, exc)
    finally:
        close_old_connections()


async def tokens(prompt: str) -> AsyncIterator[str]:
    """The answer's tokens at ``CHAT_TOKENS_PER_SECOND``, as a streaming model client yields them."""
    pause = 1 / getattr(settings, "CHAT_TOKENS_PER_SECOND", 30)
    for token in answer(prompt):
        yield token
        await asyncio.sleep(pause)


def generate_parts(stream_id: uuid.UUID, prompt: str) -> None:
    """Write the answer as one AI SDK assistant message, then close the stream."""
    try:
        ending = asyncio.run(aisdk.write_answer(stream_id, tokens(prompt)))
    except Exception:  # its readers end it once its lease runs out
        logger.exception("could not write the answer in stream %s", stream_id)
    else:
        logger.info("the answer in stream %s ended: %s", stream_id, ending)


def start(stream_id: uuid.UUID, prompt: str, *, parts: bool = False) -> None:
    """Answer in the background, in one of a few named worker threads of this process: as plain
    tokens, or with ``parts`` as the AI SDK's message parts."""
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="chat-llm")
    _executor.submit(generate_parts if parts else generate, stream_id, prompt)
