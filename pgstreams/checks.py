"""System checks (``manage.py check``) for pgstreams' settings and database."""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, Warning, register
from django.db import connections

from . import conf

_SETTING_IDS = {
    "NOTIFY_MODE": "pgstreams.E002",
    "FLUSH_INTERVAL": "pgstreams.E003",
    "POLL_INTERVAL": "pgstreams.E004",
    "CHANNEL": "pgstreams.E005",
    "MAX_CHUNK_BYTES": "pgstreams.E006",
    "DATABASE": "pgstreams.E007",
    "AUTHORIZE": "pgstreams.E008",
    "PREPARED_STATEMENTS": "pgstreams.E009",
}


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    found: list[Any] = []
    for name, check_id in _SETTING_IDS.items():
        error = conf.problem(name)
        if error:
            found.append(Error(error, hint=f"Fix or remove {name} in settings.PGSTREAMS.", id=check_id))
    unknown = conf.unknown_keys()
    if unknown:
        found.append(
            Warning(
                f"settings.PGSTREAMS has keys pgstreams does not know: {', '.join(unknown)}",
                hint=f"The settings are {', '.join(conf.DEFAULTS)}.",
                id="pgstreams.W001",
            )
        )
    return found


@register(deploy=False)
def check_database(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    if conf.problem("DATABASE"):
        return []  # reported by check_settings
    alias = conf.database()
    vendor = connections[alias].vendor
    if vendor != "postgresql":
        return [
            Error(
                f"pgstreams needs PostgreSQL, but database {alias!r} is {vendor}",
                hint="Point PGSTREAMS['DATABASE'] at a PostgreSQL database (12 or newer).",
                id="pgstreams.E001",
            )
        ]
    return []
