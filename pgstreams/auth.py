"""Who may read a stream: the default rules for ``PGSTREAMS['AUTHORIZE']`` and
``PGSTREAMS['DURABLE_AUTHORIZE']``, and the one lookup that the WebSocket consumer, the SSE view
and ``{% stream_html %}`` all go through."""

from __future__ import annotations

import uuid
from typing import Any

from django.core.exceptions import PermissionDenied

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
