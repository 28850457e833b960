"""App configuration: wires up the system checks and the signals pgstreams receives (the Tasks
API's ``task_finished``, for generations; ``connection_created``, for the shortcut's request
cycle). No queries and no threads start here."""

from django.apps import AppConfig


class PgStreamsConfig(AppConfig):
    name = "pgstreams"
    verbose_name = "Streams"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, generations  # noqa: F401  (importing checks registers them)
        from .durable import cycle  # noqa: F401  (importing it connects its receiver)

        generations.connect_signals()
