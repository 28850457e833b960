"""A shortcut for the Durable Streams endpoint in a project's ASGI application:
``DurableStreamsFirst(django_application)`` answers the requests under the endpoint's URL (where
``pgstreams.urls`` mounts ``v1/stream/<path>``) itself and hands every other request to Django.

Django runs each request through the project's middleware, and under ASGI every middleware method
that is not async hops to a thread and back: about twenty hops a request with Django's default
stack, which measured 110 trivial requests/s per process on a 2-CPU machine. The shortcut gives
the endpoint's view what that middleware would (the session and the user, lazily) and nothing
else: the view itself sets its security headers and applies Django's CSRF check. Without the
shortcut the same view answers through Django, only slower.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from importlib import import_module
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import aget_user, get_user
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, ASGIRequest, get_script_prefix
from django.core.handlers.exception import response_for_exception
from django.urls import set_script_prefix
from django.utils.functional import SimpleLazyObject

from . import views

ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


class DurableStreamsFirst:
    """An ASGI application: the Durable Streams endpoint's requests to its view directly, the
    others to ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._handler: _Handler | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if self._handler is None:
                self._handler = _Handler()
            path = scope["path"].removeprefix(scope.get("root_path", ""))
            if path.startswith(self._handler.root):
                await self._handler(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _Handler(ASGIHandler):
    """Django's ASGI handler's parts (the body, disconnects, responses) around the one view:
    no middleware chain, no request signals (their receivers close the request thread's database
    connections, and the view uses none), and no thread of its own per request."""

    def __init__(self) -> None:  # no middleware to load
        self.root = views.endpoint_root()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        request = ASGIRequest(scope, body_file)
        _authenticate(request)
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
            response = await views.stream(request, request.path_info.removeprefix(self.root))
        except Exception as exc:
            response = await sync_to_async(response_for_exception, thread_sensitive=False)(request, exc)
        await self.send_response(response, send)


def _authenticate(request: Any) -> None:
    """What SessionMiddleware and AuthenticationMiddleware give a request, loaded when used."""
    if "django.contrib.sessions" in settings.INSTALLED_APPS:
        engine = import_module(settings.SESSION_ENGINE)
        request.session = engine.SessionStore(request.COOKIES.get(settings.SESSION_COOKIE_NAME))
        request.user = SimpleLazyObject(lambda: get_user(request))
        request.auser = partial(aget_user, request)
