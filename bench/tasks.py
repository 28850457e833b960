"""The tasks the takeover benchmark and the generation tests run in real worker processes
(``manage.py db_worker``): a deterministic model in miniature, which goes on from where the
stream is, written plain (``count``) or as an AI SDK answer (``answer``)."""

from __future__ import annotations

import os
import time

from pgstreams import aisdk, generations
from pgstreams.exceptions import ProducerFenced, StreamClosed
from pgstreams.models import Stream

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task


@task
def count(
    stream_id: str,
    n: int,
    delay: float,
    die_at: int | None = None,
    hang_at: int | None = None,
    fail_first: str | None = None,
) -> str:
    """Write "0 ", "1 ", ... "<n-1> ", a chunk every ``delay`` seconds, from the offset the stream
    has reached, then close it with "end". With ``die_at``, the worker process dies when the
    stream reaches that offset (every attempt does); with ``hang_at``, the first attempt hangs
    there (a model call that never returns); with ``fail_first``, the first attempt raises
    "before" its take or "inside" its block (a stale connection, say), or its worker process
    "dies before" its take."""
    if fail_first in ("before", "dies before") and _attempt(stream_id) == 1:
        if fail_first == "dies before":
            os._exit(1)
        raise RuntimeError("the first attempt fails before it takes the generation")
    try:
        with generations.take(stream_id) as taken:
            if fail_first == "inside" and taken.attempt == 1:
                raise RuntimeError("the first attempt fails once it has taken the generation")
            for i in range(len(taken.chunks), n):
                if i == die_at:
                    os._exit(1)
                if i == hang_at and taken.attempt == 1:
                    time.sleep(3600)
                time.sleep(delay)
                taken.write(f"{i} ")
            taken.close("end")
    except (StreamClosed, ProducerFenced) as exc:  # ended, or taken by a later run
        return type(exc).__name__
    return "finished"


def _attempt(stream_id: str) -> int:
    return Stream.objects.get(pk=stream_id).metadata[generations.KEY]["attempt"]


@task
def answer(stream_id: str, n: int, delay: float) -> str:
    """An AI SDK answer of ``n`` words, "w0 w1 ...", a word every ``delay`` seconds, going on from
    the words an earlier run wrote."""

    def words(text: str):
        for i in range(len(text.split()), n):
            time.sleep(delay)
            yield f"w{i} "

    return aisdk.generate(stream_id, words)
