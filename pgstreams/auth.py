"""Who may read a stream: the default rules for ``PGSTREAMS['AUTHORIZE']`` and
``PGSTREAMS['DURABLE_AUTHORIZE']``, the one lookup that the WebSocket consumer, the SSE view
and ``{% stream_html %}`` all go through, and the user of an HTTP request as Django's middleware
left it (``arequest_user``), which the endpoints read on the event loop."""

from __future__ import annotations

import uuid
from functools import cache
from types import CodeType
from typing import Any

from django.contrib.auth.middleware import AuthenticationMiddleware
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject, empty

from . import conf
from .exceptions import StreamNotFound
from .models import Stream
from .threads import lookups


def may_view_all(user: Any) -> bool:
    """Whether ``user`` may read every stream: the admin's own rule for viewing streams, the
    ``pgstreams.view_stream`` permission (or ``change_stream``, which includes viewing).
    Active superusers have every permission; being staff alone grants none."""
    return bool(user.has_perm("pgstreams.view_stream") or user.has_perm("pgstreams.change_stream"))


def default_authorize(user: Any, stream: Stream) -> bool:
    """The stream's owner and users who may view all streams (``may_view_all``) may read it;
    a stream with no owner, anyone with its id."""
    if stream.owner_id is None:
        return True
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    return user.pk == stream.owner_id or may_view_all(user)


def default_durable_authorize(request: Any, action: str, path: str, stream: Stream | None) -> bool:
    """At the Durable Streams endpoint: reading (GET, HEAD, and the source of a fork) as
    ``AUTHORIZE`` says; creating, appending, closing and deleting never, until a project's own
    rule allows them."""
    user = getattr(request, "user", None)  # None in a project without AuthenticationMiddleware
    return action == "read" and stream is not None and conf.authorize()(user, stream)


def _readable_stream(user: Any, stream_id: uuid.UUID) -> Stream:
    stream = Stream.objects.using(conf.database()).filter(pk=stream_id, deleted_at__isnull=True).first()
    if stream is None:
        raise StreamNotFound(f"no stream {stream_id}")
    if not conf.authorize()(user, stream):
        raise PermissionDenied(f"not allowed to read stream {stream_id}")
    return stream


_areadable_stream = lookups.wrap(_readable_stream)


async def readable_stream(user: Any, stream_id: uuid.UUID) -> Stream:
    """The stream, if ``user`` may read it.

    Raises:
        StreamNotFound: no such stream.
        PermissionDenied: the AUTHORIZE callable said no.
    """
    return await _areadable_stream(user, stream_id)


async def arequest_user(request: Any) -> Any:
    """The request's user as Django's views see it, on the event loop: ``request.user`` as the
    last middleware to set it left it (``RemoteUserMiddleware``, a token authentication: it wins,
    as it does for every sync view); while it is still AuthenticationMiddleware's lazy user, not
    yet loaded, ``await request.auser()``, Django's async load of that same user; another
    middleware's lazy user, loaded on a thread. None without either.

    ``request.auser()`` alone is not that user: Django's middleware that sign a user in set
    ``request.user`` only (``RemoteUserMiddleware``'s async path even caches the anonymous user
    in ``auser()`` before it does)."""
    user = getattr(request, "user", None)
    if not isinstance(user, SimpleLazyObject) or user._wrapped is not empty:
        return user
    auser = getattr(request, "auser", None)
    code = _setup_code(user)
    if auser is not None and code is not None and code is _authentication_middleware_code():
        return await auser()
    return await _loaded(user)


def _setup_code(user: SimpleLazyObject) -> CodeType | None:
    return getattr(vars(user).get("_setupfunc"), "__code__", None)


@cache
def _authentication_middleware_code() -> CodeType | None:
    """The code that loads the lazy user AuthenticationMiddleware sets, found by letting it set one."""
    probe = HttpRequest()
    probe.session = None  # it checks only that there is one; the user is never loaded here
    AuthenticationMiddleware(lambda request: None).process_request(probe)
    return _setup_code(probe.user)


@lookups.wrap
def _loaded(user: SimpleLazyObject) -> Any:
    """A lazy user, loaded off the event loop (loading it may query)."""
    _ = user.is_authenticated
    return user
