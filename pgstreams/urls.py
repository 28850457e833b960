"""HTTP routes, to ``include()`` in a project's URLconf: ``streams/<uuid:stream_id>/events``."""

from django.urls import path

from . import views

app_name = "pgstreams"

urlpatterns = [
    path("streams/<uuid:stream_id>/events", views.events, name="events"),
    path("metrics/", views.metrics_view, name="metrics"),
]
