"""A URLconf whose first route is translated (``gettext_lazy``, as Django's "Translating URL
patterns" does), before pgstreams': ``tests/test_shortcut.py`` resolves the endpoint's paths
through it in two languages."""

from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy


def translated(request: HttpRequest, name: str) -> HttpResponse:
    return HttpResponse("translated")


urlpatterns = [
    path(format_lazy("pgstreams/v1/stream/{}/<str:name>", gettext_lazy("Messages")), translated),  # de: Mitteilungen
    path("pgstreams/", include("pgstreams.urls")),
]
