"""WebSocket routes, for a project's ``URLRouter``: ``ws/pgstreams/<uuid:stream_id>/``."""

from django.urls import path

from .consumers import StreamConsumer

websocket_urlpatterns = [
    path("ws/pgstreams/<uuid:stream_id>/", StreamConsumer.as_asgi(), name="pgstreams-ws"),
]
