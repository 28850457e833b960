"""HTTP routes, to ``include()`` in a project's URLconf: ``streams/<uuid:stream_id>/events`` (SSE),
``v1/stream/<path>`` (the Durable Streams protocol) and ``metrics/``."""

from django.urls import path

from . import views
from .durable import views as durable

app_name = "pgstreams"

urlpatterns = [
    path("streams/<uuid:stream_id>/events", views.events, name="events"),
    path("metrics/", views.metrics_view, name="metrics"),
    path("v1/stream/<path:path>", durable.stream, name="durable-stream"),
]
