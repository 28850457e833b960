"""A shortcut for the Durable Streams endpoint and pgstreams' SSE view in a project's ASGI
application: ``DurableStreamsFirst(django_application)`` answers the requests under the
endpoint's URL (where ``pgstreams.urls`` mounts ``v1/stream/<path>``) and those of
``streams/<uuid>/events`` itself, and hands every other request to Django.

Django runs each request through the project's middleware, and under ASGI every middleware method
that is not async hops to a thread and back: about twenty hops a request with Django's default
stack, which measured 110 trivial requests/s per process on a 2-CPU machine. Those hops run on a
thread of the request's own, kept until its response ends: an OS thread for each open SSE
response, 2,000 threads for 2,000 idle subscribers. The shortcut does, on
the event loop, what the middleware it knows would do for the endpoint (``APPLIED``), and always
checks the host against ``ALLOWED_HOSTS``. When ``MIDDLEWARE`` holds any other middleware (a token
authentication, a remote user, a project's own), it does not guess: the endpoint's requests go
through Django, middleware and all, only slower, and it says so once in the log. No protection of
the project's is skipped.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from functools import partial
from importlib import import_module
from typing import Any, Final
from uuid import UUID

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import aget_user, get_user
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, ASGIRequest, get_script_prefix
from django.core.handlers.exception import response_for_exception
from django.http import HttpResponseBase
from django.urls import get_script_prefix as current_script_prefix
from django.urls import reverse, set_script_prefix
from django.urls.converters import UUIDConverter
from django.utils.functional import SimpleLazyObject
from django.utils.module_loading import import_string

from .. import views as pgstreams_views
from . import views

View = Callable[..., Awaitable[HttpResponseBase]]

logger = logging.getLogger("pgstreams.durable")

ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]

SECURITY = "django.middleware.security.SecurityMiddleware"
COMMON = "django.middleware.common.CommonMiddleware"
SESSIONS = "django.contrib.sessions.middleware.SessionMiddleware"
AUTHENTICATION = "django.contrib.auth.middleware.AuthenticationMiddleware"
LOGIN_REQUIRED = "django.contrib.auth.middleware.LoginRequiredMiddleware"
X_FRAME = "django.middleware.clickjacking.XFrameOptionsMiddleware"
CSP = "django.middleware.csp.ContentSecurityPolicyMiddleware"  # Django 6.0 and later
# The middleware the shortcut stands in for, and what it does of each.
APPLIED: Final = {
    SECURITY: "its redirect to HTTPS and its headers (HSTS and the others)",
    COMMON: "its refusal of DISALLOWED_USER_AGENTS and its PREPEND_WWW redirect",
    SESSIONS: "the session",
    AUTHENTICATION: "the user",
    LOGIN_REQUIRED: "its redirect of anonymous users to LOGIN_URL",
    X_FRAME: "its X-Frame-Options header",
    CSP: "its Content-Security-Policy headers (SECURE_CSP, SECURE_CSP_REPORT_ONLY)",
    "django.middleware.csrf.CsrfViewMiddleware": "nothing: the view applies the CSRF check itself",
    "django.contrib.messages.middleware.MessageMiddleware": "nothing: the endpoint has no messages",
}


class DurableStreamsFirst:
    """An ASGI application: the Durable Streams endpoint's requests and the SSE view's to their
    views directly, the others to ``app`` (and those too, when ``MIDDLEWARE`` holds middleware the
    shortcut does not stand in for)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._handler: _Handler | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if self._handler is None:
                self._handler = _Handler()
            path = scope["path"].removeprefix(scope.get("root_path", ""))
            if self._handler.takes_over and self._handler.route(path, scope["method"]) is not None:
                await self._handler(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _never(request: Any) -> None:
    raise AssertionError("the shortcut calls its middleware's hooks, never their get_response")


class _Handler(ASGIHandler):
    """Django's ASGI handler's parts (the body, disconnects, responses) around the two views and
    the middleware it stands in for: no middleware chain, no request signals (their receivers
    close the request thread's database connections, and the views use none), and no thread of
    its own per request."""

    def __init__(self) -> None:  # no middleware chain to load
        self.root = views.endpoint_root()
        # streams/<uuid>/events wherever the project mounts it, read from the URL it reverses to.
        before, after = reverse("pgstreams:events", kwargs={"stream_id": UUID(int=0)}).split(str(UUID(int=0)))
        self.events = re.compile(f"{re.escape(before)}({UUIDConverter.regex}){re.escape(after)}")
        others = [name for name in settings.MIDDLEWARE if name not in APPLIED]
        self.takes_over = not others
        if others:
            logger.warning(
                "pgstreams: DurableStreamsFirst hands the Durable Streams endpoint's requests to Django: "
                "MIDDLEWARE holds %s, which it does not stand in for",
                ", ".join(others),
            )
        present = set(settings.MIDDLEWARE)
        self.sessions = SESSIONS in present
        self.authentication = AUTHENTICATION in present
        # CommonMiddleware asks the request's host first thing (DisallowedHost): once is enough.
        self.checks_host = COMMON not in present
        # The hooks of the middleware it runs itself, in MIDDLEWARE's order; none does any I/O.
        hooks = {
            name: import_string(name)(_never) for name in present & {SECURITY, COMMON, LOGIN_REQUIRED, X_FRAME, CSP}
        }
        ordered = [hooks[name] for name in settings.MIDDLEWARE if name in hooks]
        self.on_request = [m.process_request for m in ordered if hasattr(m, "process_request")]
        self.on_view = [m.process_view for m in ordered if hasattr(m, "process_view")]
        self.on_response = [m.process_response for m in reversed(ordered) if hasattr(m, "process_response")]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        prefix = get_script_prefix(scope)
        if (prefix if prefix.endswith("/") else f"{prefix}/") != current_script_prefix():  # cheaper than setting it
            set_script_prefix(prefix)
        request = ASGIRequest(scope, body_file)
        if request.method != "GET":
            # A write or a HEAD answers as soon as it is done; cancelled when its client went
            # away, it would be done all the same (an append handed to the appender commits), so
            # it has no listener for the disconnect: two tasks less, a tenth of a request's CPU.
            try:
                await self._respond(request, send)
            finally:
                body_file.close()
            return
        # As Django does: a client that goes away cancels the response (an SSE one, above all).
        tasks = [
            asyncio.create_task(self.listen_for_disconnect(receive)),
            asyncio.create_task(self._respond(request, send)),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            body_file.close()

    async def _respond(self, request: ASGIRequest, send: Any) -> None:
        try:
            response = await self._get_response(request)
        except Exception as exc:
            response = await sync_to_async(response_for_exception, thread_sensitive=False)(request, exc)
        await self.send_response(response, send)

    def route(self, path: str, method: str) -> tuple[View, dict[str, Any]] | None:
        """The view of the URL path ``path`` and its arguments, if it is one of the two (the SSE
        view for a GET only: Django's CSRF check answers other methods there)."""
        if path.startswith(self.root):
            return views.stream, {"path": path.removeprefix(self.root)}
        if method == "GET" and (events := self.events.fullmatch(path)) is not None:
            return pgstreams_views.events, {"stream_id": UUID(events[1])}
        return None

    async def _get_response(self, request: ASGIRequest) -> HttpResponseBase:
        """What the middleware and the view would answer, in Django's order."""
        if self.checks_host:
            request.get_host()  # DisallowedHost (400) unless ALLOWED_HOSTS has it, as Django checks
        self._authenticate(request)
        route = self.route(request.path_info, request.method or "")
        assert route is not None  # __call__ routed the request here by the same path
        view, kwargs = route
        response = None
        for on_request in self.on_request:
            if (response := on_request(request)) is not None:
                break
        else:
            if self.on_view and self.authentication:
                request.user = await request.auser()  # loaded now: the hooks below must not query
            for on_view in self.on_view:
                if (response := on_view(request, view, (), kwargs)) is not None:
                    break
            else:
                response = await view(request, **kwargs)
        for on_response in self.on_response:
            response = on_response(request, response)
        return response

    def _authenticate(self, request: Any) -> None:
        """What SessionMiddleware and AuthenticationMiddleware give a request, loaded when used."""
        if self.sessions:
            engine = import_module(settings.SESSION_ENGINE)
            request.session = engine.SessionStore(request.COOKIES.get(settings.SESSION_COOKIE_NAME))
        if self.authentication:
            request.user = SimpleLazyObject(lambda: get_user(request))
            request.auser = partial(aget_user, request)
