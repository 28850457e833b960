"""Where async callers run pgstreams' blocking database work: four pools of named threads per
process, each thread with Django connections of its own. ``writes`` (``ASYNC_THREADS`` threads)
runs the async twins of the writers; ``lookups`` (two threads) runs the WebSocket and SSE
endpoints' authorization lookups, so that writes waiting on row locks never hold up a connect;
``durable`` and ``durable_writes`` (``ASYNC_THREADS`` threads each) run the Durable Streams
endpoint's reads and its writes, so that writes waiting on a stream's row lock never hold up
reads.

Not asgiref's one shared thread, which ``sync_to_async`` uses by default outside a request: there,
one write waiting on a row lock would hold up every other write and every WebSocket's
authorization lookup in the process. Only for work that needs no caller's transaction (an async
caller has none). A pool thread keeps its connections open between calls, as a thread outside
Django's request cycle does; one the server closed, or that failed and no longer answers, is
replaced at the next call. A pool stopped (``stop_pools()``, or at exit) has each thread close its
connections. The threads are joined when the interpreter exits, so a call blocked on a
connection whose peer vanished holds the exit as long as that connection's own limits allow
(give the alias ``connect_timeout``, keepalives and ``tcp_user_timeout`` in OPTIONS).
"""

from __future__ import annotations

import contextlib
import functools
import select
import threading
from collections.abc import Awaitable, Callable
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, ParamSpec, TypeVar

import psycopg
from asgiref.sync import SyncToAsync
from django.db import connections

from . import conf
from .process import PerProcess

P = ParamSpec("P")
R = TypeVar("R")

LOOKUP_THREADS: Final = 2
STOP_TIMEOUT: Final = 2.0  # seconds a stopping pool waits for its threads to close their connections


class _Threads(ThreadPoolExecutor):
    """A pool's threads, which know how many they may be."""

    def __init__(self, size: int, name: str) -> None:
        super().__init__(max_workers=size, thread_name_prefix=name)
        self.size = size

    def stop(self) -> None:
        """Have each thread close its Django connections, and return once they have, then end
        the threads. Each thread takes one closing task and waits at a barrier, so no thread
        takes two; one still busy after STOP_TIMEOUT keeps its connections until it ends."""
        barrier = threading.Barrier(self.size, timeout=STOP_TIMEOUT)

        def close_mine() -> None:
            connections.close_all()
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait()

        closing = []
        with contextlib.suppress(RuntimeError):  # the interpreter is exiting: the threads are gone
            closing = [self.submit(close_mine) for _ in range(self.size)]
        futures.wait(closing, timeout=STOP_TIMEOUT + 1)
        self.shutdown(wait=False)


class Pool:
    """Named threads that run blocking calls for async callers; made on first use, with the
    size ``size()`` says then, and anew in a forked child."""

    def __init__(self, name: str, size: Callable[[], int]) -> None:
        self._executors = PerProcess(lambda: _Threads(size(), name), _Threads.stop)

    def stop(self) -> None:
        """Close the Django connections of every thread of the pool and end the threads (as at
        exit); the next call starts new ones."""
        self._executors.stop()

    def wrap(self, func: Callable[P, R]) -> Callable[P, Awaitable[R]]:
        """``func`` for async callers: the same call, run on this pool, never on the event loop."""

        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            _drop_broken_connections()
            return func(*args, **kwargs)

        @functools.wraps(func)
        async def run(*args: P.args, **kwargs: P.kwargs) -> R:
            return await SyncToAsync(call, thread_sensitive=False, executor=self._executors.get())(*args, **kwargs)

        return run


writes = Pool("pgstreams-write", conf.async_threads)
lookups = Pool("pgstreams-lookup", lambda: LOOKUP_THREADS)
durable = Pool("pgstreams-durable", conf.async_threads)
durable_writes = Pool("pgstreams-durable-write", conf.async_threads)


def stop_pools() -> None:
    """Stop the pools, their threads' Django connections closed."""
    for pool in (writes, lookups, durable, durable_writes):
        pool.stop()


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
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    return bool(poller.poll(0))
