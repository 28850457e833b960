"""The WebSocket Origin check, as strict as Django's CSRF check: ``CsrfOriginValidator(app)``
accepts a handshake whose ``Origin`` is the request's own origin (scheme, host and port: the host
as ``HttpRequest.get_host()`` reads it, within ``ALLOWED_HOSTS``; ``https`` where
``is_secure()`` says so, ``SECURE_PROXY_SSL_HEADER`` included) or one of
``CSRF_TRUSTED_ORIGINS`` (its ``*.`` entries with their subdomains), as
``CsrfViewMiddleware`` judges the Origin of a form's POST; it refuses any other handshake with
403, and one without an ``Origin`` (browsers always send it).

Channels' ``AllowedHostsOriginValidator`` matches the Origin's host alone: a page served on
another port or scheme of the site's host, to which the browser sends the site's cookies, could
open a WebSocket as the signed-in user and read the user's streams.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest
from django.utils.http import is_same_domain

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class CsrfOriginValidator:
    """ASGI middleware for the ``websocket`` protocol: ``application`` gets the handshakes whose
    Origin Django's CSRF check would accept (``origin_allowed``); the others are refused (403).
    Other scopes pass through."""

    def __init__(self, application: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.application = application

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and not origin_allowed(scope):
            if (await receive())["type"] == "websocket.connect":
                await send({"type": "websocket.close"})  # before the accept: the server answers 403
            return
        await self.application(scope, receive, send)


def origin_allowed(scope: Scope) -> bool:
    """Whether the handshake's Origin is its own origin or a trusted one, as
    ``CsrfViewMiddleware`` decides for an HTTP request with the same headers and scheme."""
    request = _Handshake(scope)
    origin = request.META.get("HTTP_ORIGIN")
    if origin is None:
        return False
    try:
        host = request.get_host()
    except DisallowedHost:
        pass
    else:
        if origin == f"{'https' if request.is_secure() else 'http'}://{host}":
            return True
    trusted = settings.CSRF_TRUSTED_ORIGINS
    if origin in trusted and "*" not in origin:
        return True
    try:
        parsed = urlsplit(origin)
    except ValueError:
        return False
    return any(
        is_same_domain(parsed.netloc, urlsplit(entry).netloc.lstrip("*"))
        for entry in trusted
        if "*" in entry and urlsplit(entry).scheme == parsed.scheme
    )


class _Handshake(HttpRequest):
    """A WebSocket handshake as Django's ``ASGIRequest`` would make an HTTP request of it (its
    headers in META, decoded as Latin-1, repeated ones joined with commas; the server's name and
    port), but with ``wss`` read as ``https``: ``get_host()`` and ``is_secure()`` are Django's."""

    def __init__(self, scope: Scope) -> None:
        super().__init__()
        self._secure = scope.get("scheme", "ws") in ("wss", "https")
        server = scope.get("server") or ("unknown", "0")
        self.META["SERVER_NAME"], self.META["SERVER_PORT"] = str(server[0]), str(server[1])
        for name, value in scope.get("headers", []):
            key = "HTTP_" + name.decode("latin1").upper().replace("-", "_")
            text = value.decode("latin1")
            self.META[key] = f"{self.META[key]},{text}" if key in self.META else text

    def _get_scheme(self) -> str:
        return "https" if self._secure else "http"
