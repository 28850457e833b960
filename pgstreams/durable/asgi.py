"""A shortcut for the Durable Streams endpoint and pgstreams' SSE view in a project's ASGI
application: ``DurableStreamsFirst(django_application)`` answers the requests under the
endpoint's URL (where ``pgstreams.urls`` mounts ``v1/stream/<path>``) and those of
``streams/<uuid>/events`` itself, and hands every other request to Django.

Under ASGI, Django runs each middleware method that is not async on a thread and back: about
twenty hops a request with Django's default stack, which measured 110 trivial requests/s per
process on a 2-CPU machine, and those hops run on a thread of the request's own, kept until its
response ends: 2,000 threads for 2,000 open SSE responses. The shortcut is Django's own ASGI
handler (its ``handle()``: the body, the request signals, the URL resolver, exceptions,
disconnects, the response and its close, as each Django version has them) with these
differences: it calls the hooks of the middleware it knows (``KNOWN``) on the event loop, and
hops to ``sync_to_async``'s one thread only for a hook that may query the database
(``_QUERIES``: a session's save, a user's load); it sends the request signals, and remembers a
path's resolution, as ``cycle`` says (on the event loop, once per path, where that is the same);
it makes ``MessageMiddleware``'s storage when first used, where making it cannot fail. So it
answers as Django does, proven by sending the same requests both ways (``tests/test_shortcut.py``).

Not here: middleware it does not know. When ``MIDDLEWARE`` holds one (a token authentication, a
remote user, a project's own), it does not guess: the endpoint's requests go through Django,
middleware and all, only slower, and it says so once in the log.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, Final
from uuid import UUID

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.messages.storage import default_storage
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpRequest, HttpResponseBase
from django.urls import get_script_prefix, reverse
from django.urls.converters import UUIDConverter
from django.utils.functional import SimpleLazyObject, empty
from django.utils.module_loading import import_string

from . import cycle, views

logger = logging.getLogger("pgstreams.durable")

ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]
Respond = Callable[[HttpRequest], Awaitable[HttpResponseBase]]

SECURITY = "django.middleware.security.SecurityMiddleware"
COMMON = "django.middleware.common.CommonMiddleware"
SESSIONS = "django.contrib.sessions.middleware.SessionMiddleware"
CSRF = "django.middleware.csrf.CsrfViewMiddleware"
AUTHENTICATION = "django.contrib.auth.middleware.AuthenticationMiddleware"
LOGIN_REQUIRED = "django.contrib.auth.middleware.LoginRequiredMiddleware"  # Django 5.1 and later
MESSAGES = "django.contrib.messages.middleware.MessageMiddleware"
X_FRAME = "django.middleware.clickjacking.XFrameOptionsMiddleware"
CSP = "django.middleware.csp.ContentSecurityPolicyMiddleware"  # Django 6.0 and later
# The middleware whose hooks the shortcut calls itself: Django's own, whose hooks reach the
# database only through the request's session and user, as ``_QUERIES`` lists.
KNOWN: Final = frozenset({SECURITY, COMMON, SESSIONS, CSRF, AUTHENTICATION, LOGIN_REQUIRED, MESSAGES, X_FRAME, CSP})


def _session_saved(request: Any) -> bool:
    """SessionMiddleware's response saves a modified session (or every one)."""
    return getattr(getattr(request, "session", None), "modified", False) or settings.SESSION_SAVE_EVERY_REQUEST


def _messages_stored(request: Any) -> bool:
    """MessageMiddleware's response stores messages used or added (in the session, maybe)."""
    storage = getattr(request, "_messages", None)
    return storage is not None and not _unmade(storage) and (storage.used or storage.added_new)


def _unmade(storage: Any) -> bool:
    """``_LazyMessages``' storage, not made yet: nothing used or added."""
    return isinstance(storage, SimpleLazyObject) and storage._wrapped is empty


class _LazyMessages(MessageMiddleware):
    """MessageMiddleware whose storage is made when first used (a Durable Streams request
    seldom uses it: making one was about a twentieth of an append's CPU). A storage never made
    is one whose ``update()`` would have stored nothing: the response goes as it is. Used only
    where making the storage cannot fail (``_lazy_messages``), which otherwise fails the request
    in ``process_request``."""

    def process_request(self, request: HttpRequest) -> None:
        request._messages = SimpleLazyObject(functools.partial(default_storage, request))

    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        if _unmade(getattr(request, "_messages", None)):
            return response
        return super().process_response(request, response)


def _lazy_messages() -> bool:
    """Whether the message storage is Django's, and one whose making cannot fail: the cookie
    storage, or one of the session's after SessionMiddleware."""
    storage = settings.MESSAGE_STORAGE
    if storage == "django.contrib.messages.storage.cookie.CookieStorage":
        return True
    after_sessions = SESSIONS in settings.MIDDLEWARE[: settings.MIDDLEWARE.index(MESSAGES)]
    return after_sessions and storage in (
        "django.contrib.messages.storage.fallback.FallbackStorage",
        "django.contrib.messages.storage.session.SessionStorage",
    )


def _csrf_in_session(request: Any) -> bool:
    """CsrfViewMiddleware reads and writes its secret in the session."""
    return settings.CSRF_USE_SESSIONS


def _always(request: Any) -> bool:
    return True


# (middleware, hook): whether the hook, called now, may query the database. Such a call hops to
# sync_to_async's thread, whose connections the request signals close as on any request's thread.
_QUERIES: Final[dict[tuple[str, str], Callable[[Any], bool]]] = {
    (SESSIONS, "process_response"): _session_saved,
    (CSRF, "process_request"): _csrf_in_session,
    (CSRF, "process_view"): _csrf_in_session,
    (CSRF, "process_response"): _csrf_in_session,
    (LOGIN_REQUIRED, "process_view"): _always,  # request.user
    (MESSAGES, "process_response"): _messages_stored,
}


class DurableStreamsFirst:
    """An ASGI application: the Durable Streams endpoint's requests and the SSE view's GET
    requests to the shortcut, the others to ``app`` (and those too, when ``MIDDLEWARE`` holds
    middleware the shortcut does not know)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._handler: _Handler | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if self._handler is None:
                self._handler = _Handler()
            path = scope["path"].removeprefix(scope.get("root_path", ""))
            if self._handler.takes_over and self._handler.routes(path, scope["method"]):
                await self._handler.handle(scope, receive, send)  # without ASGIHandler's thread per request
                return
        await self.app(scope, receive, send)


def _never(request: HttpRequest) -> HttpResponseBase:
    raise AssertionError("the shortcut calls its middleware's hooks, never their get_response")


class _Handler(ASGIHandler):
    """Django's ASGI handler whose middleware chain calls the hooks of ``KNOWN`` middleware, in
    Django's order and with its conversion of exceptions at each layer, on the event loop where
    ``_QUERIES`` allows."""

    def __init__(self) -> None:  # instead of ASGIHandler's, which loads the middleware for async hops
        # The two views' URLs wherever the project mounts them, as reversed without the script
        # prefix in force (if this runs in a request's context), which routes() never sees.
        prefix = get_script_prefix()
        self.root = "/" + views.endpoint_root().removeprefix(prefix)
        events = "/" + reverse("pgstreams:events", kwargs={"stream_id": UUID(int=0)}).removeprefix(prefix)
        before, after = events.split(str(UUID(int=0)))
        self.events = re.compile(f"{re.escape(before)}{UUIDConverter.regex}{re.escape(after)}")
        unknown = [name for name in settings.MIDDLEWARE if name not in KNOWN]
        self.takes_over = not unknown
        if unknown:
            logger.warning(
                "pgstreams: DurableStreamsFirst hands the Durable Streams endpoint's requests to Django: "
                "MIDDLEWARE holds %s, which it does not know",
                ", ".join(unknown),
            )
            return
        self._view_middleware: list[Callable[..., Awaitable[HttpResponseBase | None]]] = []
        self._template_response_middleware: list[Callable[..., Awaitable[HttpResponseBase]]] = []
        self._exception_middleware: list[Callable[..., HttpResponseBase | None]] = []
        chain: Respond = convert_exception_to_response(self._get_response_async)
        for name in reversed(settings.MIDDLEWARE):  # as BaseHandler.load_middleware builds it
            lazy = name == MESSAGES and _lazy_messages()
            middleware = (_LazyMessages if lazy else import_string(name))(_never)
            if hasattr(middleware, "process_view"):
                self._view_middleware.insert(0, _hook(name, middleware.process_view))
            if hasattr(middleware, "process_template_response"):
                self._template_response_middleware.append(_hook(name, middleware.process_template_response))
            if hasattr(middleware, "process_exception"):
                self._exception_middleware.append(middleware.process_exception)  # called on a thread, as by Django
            chain = convert_exception_to_response(_layer(name, middleware, chain))
        self._middleware_chain = chain

    handle = cycle.handle()

    async def run_get_response(self, request: HttpRequest) -> HttpResponseBase:
        """Django's, the response naming Django's handler as the sender of its close's
        ``request_finished``, as Django's own handler's responses do."""
        response = await super().run_get_response(request)
        response._handler_class = ASGIHandler
        return response

    def resolve_request(self, request: HttpRequest) -> Any:
        """Django's, or its answer for the path remembered where that is the same (``cycle``)."""
        match = cycle.resolve(request)
        if match is None:
            return super().resolve_request(request)
        request.resolver_match = match
        return match

    def routes(self, path: str, method: str) -> bool:
        """Whether the URL path ``path`` is one of the two views' (the SSE view's for a GET, the
        one method a reader sends it)."""
        return path.startswith(self.root) or (method == "GET" and self.events.fullmatch(path) is not None)


def _hook(name: str, method: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """``method`` (a middleware's hook) as an async callable: called on the event loop, or on
    sync_to_async's thread when ``_QUERIES`` says it may query now."""
    queries = _QUERIES.get((name, method.__name__))
    hop = sync_to_async(method, thread_sensitive=True)

    async def call(request: HttpRequest, *args: Any) -> Any:
        if queries is not None and queries(request):
            return await hop(request, *args)
        return method(request, *args)

    return call


def _layer(name: str, middleware: Any, inner: Respond) -> Respond:
    """One middleware's layer of the chain, as ``MiddlewareMixin`` runs it around ``inner``."""
    process_request = _hook(name, middleware.process_request) if hasattr(middleware, "process_request") else None
    process_response = _hook(name, middleware.process_response) if hasattr(middleware, "process_response") else None

    async def layer(request: HttpRequest) -> HttpResponseBase:
        response = None
        if process_request is not None:
            response = await process_request(request)
        response = response or await inner(request)
        if process_response is not None:
            response = await process_response(request, response)
        return response

    return layer
