"""App configuration: wires up the system checks. No queries and no threads start here."""

from django.apps import AppConfig


class PgStreamsConfig(AppConfig):
    name = "pgstreams"
    verbose_name = "Streams"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the checks)
