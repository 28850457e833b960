"""The demo's model as tasks of Django's Tasks API, run by the workers ``manage.py demo`` starts
(``demo_project/workers.py``): each answer is a generation (``pgstreams.generations``), so a
worker killed mid-answer is replaced by another that goes on from where the answer is. The model
is ``llm.answer``, deterministic: a run that takes an answer over skips what was written."""

from __future__ import annotations

import time
from collections.abc import Iterator

from django.conf import settings

from pgstreams import aisdk, generations
from pgstreams.exceptions import StreamError

from . import llm

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task

LOST = "\n[The answer was lost: every worker that wrote it died.]"  # a plain answer's last chunk then


def _pause() -> float:
    return 1 / settings.CHAT_TOKENS_PER_SECOND


@task
def answer_tokens(stream_id: str, prompt: str) -> str:
    """The answer as plain tokens, one chunk each, from the offset the stream has reached; the
    last token closes the stream."""
    tokens = llm.answer(prompt)
    try:
        with generations.take(stream_id) as taken:
            for i in range(len(taken.chunks), len(tokens)):
                time.sleep(_pause())
                taken.write(tokens[i], close=i == len(tokens) - 1)
    except StreamError as exc:  # stopped, taken by a later run, or deleted
        return type(exc).__name__
    return "finished"


@task
def answer_parts(stream_id: str, prompt: str) -> str:
    """The answer as one AI SDK message (``aisdk.generate``), going on from its text so far."""

    def rest(text: str) -> Iterator[str]:
        written = ""
        for token in llm.answer(prompt):
            if len(written) < len(text):  # said by an earlier run
                written += token
                continue
            time.sleep(_pause())
            yield token

    return aisdk.generate(stream_id, rest)
