"""Where async callers run pgstreams' blocking database work: a pool of ``ASYNC_THREADS`` named
threads per process, each with Django connections of its own.

Not asgiref's one shared thread, which ``sync_to_async`` uses by default outside a request: there,
one write waiting on a row lock would hold up every other write and every WebSocket's
authorization lookup in the process. Only for work that needs no caller's transaction (an async
caller has none). A pool thread keeps its connections open between calls, as a thread outside
Django's request cycle does; one the server closed, or that failed and no longer answers, is
replaced at the next call.
"""

from __future__ import annotations

import functools
import os
import select
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

import psycopg
from asgiref.sync import SyncToAsync
from django.db import connections

from . import conf

P = ParamSpec("P")
R = TypeVar("R")

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def pool() -> ThreadPoolExecutor:
    """This process's pool, made on first use (and anew in a forked child)."""
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(max_workers=conf.async_threads(), thread_name_prefix="pgstreams-sync")
    return _pool


def in_pool(func: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """``func`` for async callers: the same call, run on the pool, never on the event loop."""

    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        _drop_broken_connections()
        return func(*args, **kwargs)

    @functools.wraps(func)
    async def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return await SyncToAsync(call, thread_sensitive=False, executor=pool())(*args, **kwargs)

    return run


def _drop_broken_connections() -> None:
    """Close this thread's connections that cannot serve another query, so that the next query
    opens a new one. As Django does when a request starts, a connection whose last query failed
    is checked with a round trip; so is one the server sent something while it sat idle, which
    it does to close it (a restart, a terminated backend, a pooler's idle timeout)."""
    for wrapper in connections.all(initialized_only=True):
        conn = wrapper.connection
        if conn is None or not (wrapper.errors_occurred or _spoken_to(conn)):
            continue
        if wrapper.is_usable():
            wrapper.errors_occurred = False
        else:
            wrapper.close()


def _spoken_to(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server has sent anything to this idle connection; never waits."""
    if conn.closed:
        return False
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    return bool(readable)


def _after_fork_in_child() -> None:
    global _pool, _pool_lock
    _pool = None  # the parent's threads do not exist here
    _pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
