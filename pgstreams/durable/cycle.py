"""The request cycle of the shortcut (``asgi.DurableStreamsFirst``): Django's own
``ASGIHandler.handle``, its code whatever the Django version, run with the two things it does
on a thread sent on the event loop instead wherever that does the same: the request signals
(``request_started``, then ``request_finished`` from the response's close), each of which
Django sends by a hop to ``sync_to_async``'s thread and back. And Django's URL resolver's
answer for a path remembered (``resolve``) where it can depend on nothing but the path.

The same, because of what the receivers are: when every receiver is Django's own
(``DJANGOS_RECEIVERS``), each acts only on the Django connections of the thread it runs on
(their logged queries, those past their age or broken), or on the request's context (its open
caches, its URLconf). So where no connection outside pgstreams' own threads is open or holds
logged queries (``connection_created`` tells which were opened) and no cache the context opened
has a close that does anything, the receivers would find on the event loop what they would
find on the thread, and do the same: nothing but resetting the URLconf, so only that one is
called. Otherwise, and whenever a
receiver is not Django's (a project's, an async one), the signal goes by Django's ``asend`` and
the close by its hop, as Django does. Both name ``ASGIHandler`` as their sender, as Django's own
handler does. Measured: the two hops were about a fifth of an append's CPU.

A path's resolution depends on the path alone when the URLconf's patterns, all the way down,
are Django's route and regex patterns with Django's own converters: no language prefix of
``i18n_patterns`` nor translated route (they follow the active language), no converter of a
project's (its ``to_python`` may answer otherwise another time). Then the walk over the URLconf (about a tenth
of an append's CPU, much of it building the list of patterns tried) is made once per path of up
to PATH_CHARS, and each request gets its own copy of the match.

Not here: anything else of ``handle()``; the response's close still closes what it would,
on the event loop only when that is the request's body (no uploaded files, no file response).
"""

from __future__ import annotations

import copy
import functools
import threading
import types
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Final

from asgiref.sync import sync_to_async
from django.core import signals
from django.core.cache import caches, close_caches
from django.core.cache.backends.base import BaseCache
from django.core.handlers.asgi import ASGIHandler, ASGIRequest
from django.core.handlers.base import reset_urlconf
from django.db import close_old_connections, reset_queries
from django.db.backends.signals import connection_created
from django.dispatch import Signal
from django.http import HttpRequest, HttpResponseBase
from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.converters import IntConverter, PathConverter, SlugConverter, StringConverter, UUIDConverter
from django.urls.resolvers import RegexPattern, ResolverMatch, RoutePattern

# Django's own receivers of the request signals: each acts on the Django connections of the
# thread it runs on, or on the request's context, and on nothing else.
DJANGOS_RECEIVERS: Final = frozenset({reset_queries, close_old_connections, close_caches, reset_urlconf})
DJANGOS_CONVERTERS: Final = frozenset({IntConverter, StringConverter, UUIDConverter, SlugConverter, PathConverter})
# Paths whose resolution a process remembers (the least used forgotten first), each at most
# PATH_CHARS long (a longer one is resolved afresh): about 6 MB at most whatever clients send
# (a match of a 256-character path of four-byte characters holds about 6 KB).
PATHS: Final = 1024
PATH_CHARS: Final = 256


class _Opened:
    """The Django connections ever opened on threads other than pgstreams' own (named
    ``pgstreams-``: their connections are their own, and no request signal is sent on them)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wrappers: weakref.WeakSet[Any] = weakref.WeakSet()

    def add(self, sender: Any, connection: Any, **kwargs: Any) -> None:
        if not threading.current_thread().name.startswith("pgstreams-"):
            with self.lock:
                self.wrappers.add(connection)

    def idle(self) -> bool:
        """None of them is open or holds logged queries. Those that are neither are forgotten:
        one can log a query only once open again, and opening it sends ``connection_created``."""
        with self.lock:
            for wrapper in list(self.wrappers):
                if wrapper.connection is None and not wrapper.queries_log:
                    self.wrappers.discard(wrapper)
            return not self.wrappers


_opened = _Opened()
# Connected when pgstreams' app is ready (it imports this module), before any request.
connection_created.connect(_opened.add, dispatch_uid="pgstreams.durable.cycle")


def sent_here(signal: Signal) -> bool:
    """Whether ``signal`` sent on the event loop does what it does on the thread Django's
    ``asend`` hops to: its receivers are Django's own, no connection they could act on is open
    or holds logged queries, and no cache of the request's context has a close that does
    anything (a connection's, which may block; the local memory, file, database and dummy
    caches' close does nothing)."""
    sync_receivers, async_receivers = signal._live_receivers(ASGIHandler)
    return (
        not async_receivers
        and all(receiver in DJANGOS_RECEIVERS for receiver in sync_receivers)
        and all(type(cache).close is BaseCache.close for cache in caches.all(initialized_only=True))
        and _opened.idle()
    )


class _RequestSignal:
    """A request signal as the shortcut sends it, from ``ASGIHandler`` (the sender Django's own
    handler names, not the shortcut's subclass): ``asend`` on the event loop where
    ``sent_here`` holds, else by Django's ``asend``; ``send``, where it holds (the response's
    close, which ``_closing`` lets run here only then), to the receivers left with something to
    do: ``ACTING_HERE`` (the others would find no connection open, and no cache to close)."""

    ACTING_HERE: Final = frozenset({reset_urlconf})

    def __init__(self, signal: Signal, *, asend_here: bool) -> None:
        self.signal = signal
        self.asend_here = asend_here

    async def asend(self, sender: Any, **named: Any) -> list[tuple[Any, Any]]:
        if self.asend_here and sent_here(self.signal):
            return self.send(ASGIHandler, **named)
        return await self.signal.asend(ASGIHandler, **named)

    def send(self, sender: Any, **named: Any) -> list[tuple[Any, Any]]:
        sync_receivers, _ = self.signal._live_receivers(ASGIHandler)
        acting = [receiver for receiver in sync_receivers if receiver in self.ACTING_HERE]
        return [(receiver, receiver(signal=self.signal, sender=ASGIHandler, **named)) for receiver in acting]


_SIGNALS = types.SimpleNamespace(
    request_started=_RequestSignal(signals.request_started, asend_here=True),
    # handle() asends request_finished only for a request cancelled before its response (the
    # client left): a hook's hop of its (a session's save) may still be running, about to open
    # a connection, so it goes by Django's hop, queued behind that one, which then closes it.
    request_finished=_RequestSignal(signals.request_finished, asend_here=False),
)


def _django_code(function: Any, **names: Any) -> Any:
    """``function`` (one of Django's), its own code run with ``names`` standing for those of its
    module; None if its code is not a plain function of its module's names."""
    if function.__code__.co_freevars:
        return None
    namespace = {**function.__globals__, **names}
    return types.FunctionType(function.__code__, namespace, function.__name__, function.__defaults__)


# HttpResponseBase.close sending request_finished here (used where ``sent_here`` holds).
_close_here = _django_code(HttpResponseBase.close, signals=_SIGNALS)


def _request_close(closer: Callable[[], None]) -> bool:
    """Whether ``closer`` (one of a response's) is the close Django adds of the request itself,
    of a request that received no files: it closes the request's body, which Django's
    ``handle()`` closes on the event loop too."""
    request = getattr(closer, "__self__", None)
    return (
        isinstance(request, ASGIRequest)
        and getattr(closer, "__func__", None) is ASGIRequest.close
        and not getattr(request, "_files", None)
    )


def _closing(close: Callable[[], None]) -> Callable[[], Awaitable[None]]:
    """What ``handle()`` calls in place of ``sync_to_async``, which it calls only on a response's
    close: the close on the event loop when it closes only the request's body and
    ``request_finished`` is ``sent_here``; else Django's hop."""
    response = getattr(close, "__self__", None)
    if (
        _close_here is not None
        and isinstance(response, HttpResponseBase)
        and getattr(close, "__func__", None) is HttpResponseBase.close
        and all(map(_request_close, response._resource_closers))
        and sent_here(signals.request_finished)
    ):

        async def closed() -> None:
            _close_here(response)

        return closed
    return sync_to_async(close)


def handle() -> Callable[..., Awaitable[None]]:
    """Django's ``ASGIHandler.handle`` (its own code) with ``signals`` and ``sync_to_async``
    standing for the request signals and the close made as above; Django's own function if its
    code is not a plain function of its module's names."""
    return _django_code(ASGIHandler.handle, signals=_SIGNALS, sync_to_async=_closing) or ASGIHandler.handle


def resolve(request: HttpRequest) -> ResolverMatch | None:
    """Django's ``resolver.resolve(request.path_info)`` for the project's URLconf, remembered per
    path where the URLconf allows (a copy for each request); None where it does not (a request
    with its own ``urlconf``, a URLconf with patterns or converters of a project's)."""
    if hasattr(request, "urlconf") or len(request.path_info) > PATH_CHARS:
        return None
    resolver = get_resolver()
    if not _by_path_alone(resolver):
        return None
    remembered = _resolved(resolver, request.path_info)
    match = object.__new__(ResolverMatch)  # a copy (copy.copy refuses, as pickling does), with
    # its own dicts and lists, which a request may change
    match.__dict__.update({k: copy.copy(v) if isinstance(v, dict | list) else v for k, v in vars(remembered).items()})
    return match


@functools.lru_cache(maxsize=PATHS)
def _resolved(resolver: URLResolver, path: str) -> ResolverMatch:
    return resolver.resolve(path)  # a Resolver404 is raised each time, never remembered


@functools.lru_cache(maxsize=64)
def _by_path_alone(resolver: URLResolver) -> bool:
    """Whether ``resolver`` answers by the path alone: its patterns, all the way down, Django's
    route and regex patterns, with Django's converters."""
    if type(resolver) is not URLResolver or not _plain(resolver.pattern):  # a subclass may resolve otherwise
        return False
    return all(
        _by_path_alone(entry) if isinstance(entry, URLResolver) else type(entry) is URLPattern and _plain(entry.pattern)
        for entry in resolver.url_patterns
    )


def _plain(pattern: Any) -> bool:
    """A route or regex pattern of Django's, of a plain string (a translated one, lazy, is
    compiled for the active language), with Django's converters."""
    if type(pattern) is RoutePattern:
        converters = pattern.converters.values()
        return isinstance(pattern._route, str) and all(type(c) in DJANGOS_CONVERTERS for c in converters)
    return type(pattern) is RegexPattern and isinstance(pattern._regex, str)
