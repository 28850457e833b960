"""A fake LLM: a deterministic answer for each prompt, as tokens. No network and no model. The
demo's workers write it (``tasks.py``)."""

from __future__ import annotations

import hashlib
import random

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


def answer(prompt: str) -> list[str]:
    """The tokens of the answer to ``prompt``: the same prompt always gets the same answer."""
    rng = random.Random(hashlib.sha256(prompt.encode()).digest())
    topic = " ".join(prompt.split()[:12]) or "nothing"
    sentences = [f"You asked: \u201c{topic}\u201d."] + rng.sample(_SENTENCES, rng.randint(4, 6))
    words = " ".join(sentences).split(" ")
    return [words[0]] + [" " + word for word in words[1:]]
