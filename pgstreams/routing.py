"""WebSocket routes, for a project's ``URLRouter``: ``ws/pgstreams/<stream_id>/``.

The id is matched as any path segment and checked by the consumer, so a malformed one gets close
code 4400 and a reason instead of a routing error. Put the router behind
``pgstreams.origin.CsrfOriginValidator`` (and Channels' ``AuthMiddlewareStack``), which refuses
a handshake from any origin Django's CSRF check would refuse."""

from django.urls import path

from .consumers import StreamConsumer

websocket_urlpatterns = [
    path("ws/pgstreams/<str:stream_id>/", StreamConsumer.as_asgi(), name="pgstreams-ws"),
]
