"""System checks (``manage.py check``) for pgstreams' settings and database."""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, Warning, register
from django.db import connections

from . import conf


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    found: list[Any] = [
        Error(error, hint=f"Fix or remove {setting.name} in settings.PGSTREAMS.", id=setting.check_id)
        for setting in conf.SETTINGS.values()
        if (error := setting.problem())
    ]
    if not (conf.channel.problem() or conf.notify_shards.problem()) and conf.notify_shards() > 1:
        longest = f"{conf.channel()}_{conf.notify_shards() - 1}"
        if len(longest.encode()) > 63:
            found.append(
                Error(
                    f"the notification channel {longest!r} is over Postgres' 63 bytes",
                    hint="Shorten CHANNEL or lower NOTIFY_SHARDS in settings.PGSTREAMS.",
                    id="pgstreams.E027",
                )
            )
    unknown = conf.unknown_keys()
    if unknown:
        found.append(
            Warning(
                f"settings.PGSTREAMS has keys pgstreams does not know: {', '.join(unknown)}",
                hint=f"The settings are {', '.join(conf.SETTINGS)}.",
                id="pgstreams.W001",
            )
        )
    return found


@register(deploy=False)
def check_database(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    if conf.database.problem():
        return []  # reported by check_settings
    alias = conf.database()
    vendor = connections[alias].vendor
    if vendor != "postgresql":
        return [
            Error(
                f"pgstreams needs PostgreSQL, but database {alias!r} is {vendor}",
                hint=(
                    "Point PGSTREAMS['DATABASE'] (default: 'default') at a PostgreSQL database, "
                    "with ENGINE 'django.db.backends.postgresql'; PostgreSQL 15 and 18 are tested."
                ),
                id="pgstreams.E001",
            )
        ]
    return []


@register()
def check_listen_database(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """LISTEN needs a session of its own: through PgBouncer in transaction mode it goes deaf."""
    if conf.listen_database_setting.problem() or conf.database.problem():
        return []
    alias = conf.listen_database()
    settings_dict = connections[alias].settings_dict
    options = " ".join(str(v) for v in settings_dict.get("OPTIONS", {}).values()).lower()
    if str(settings_dict.get("PORT") or "") == "6432" or "pgbouncer" in options:
        return [
            Warning(
                f"pgstreams' listener connects through database {alias!r}, which looks like PgBouncer "
                "(port 6432 or an option naming it); LISTEN does not work in transaction pooling mode",
                hint="Set PGSTREAMS['LISTEN_DATABASE'] to an alias that connects to Postgres directly.",
                id="pgstreams.W002",
            )
        ]
    return []


@register()
def check_websocket_routing(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """With channels installed, ASGI_APPLICATION should route a WebSocket path to StreamConsumer."""
    from django.apps import apps
    from django.conf import settings

    path = getattr(settings, "ASGI_APPLICATION", None)
    if not apps.is_installed("channels") or not path:
        return []
    from django.utils.module_loading import import_string

    from .consumers import StreamConsumer

    try:
        application = import_string(path)
    except ImportError as exc:
        return [Warning(f"ASGI_APPLICATION {path!r} cannot be imported: {exc}", id="pgstreams.W003")]
    if _routes_to(application, StreamConsumer, depth=0):
        return []
    return [
        Warning(
            f"channels is installed, but no WebSocket route of ASGI_APPLICATION ({path}) leads to "
            "pgstreams' StreamConsumer: browsers cannot follow streams",
            hint="Add pgstreams.routing.websocket_urlpatterns to the URLRouter of the 'websocket' protocol.",
            id="pgstreams.W003",
        )
    ]


def _routes_to(app: Any, consumer: type, depth: int) -> bool:
    """Walk routers and middleware (their usual attributes) looking for ``consumer``."""
    if depth > 20 or app is None:
        return False
    if getattr(app, "consumer_class", None) is consumer:
        return True
    for route in getattr(app, "routes", None) or []:  # URLRouter
        if _routes_to(getattr(route, "callback", None), consumer, depth + 1):
            return True
    mapping = getattr(app, "application_mapping", None)  # ProtocolTypeRouter
    if mapping:
        return _routes_to(mapping.get("websocket"), consumer, depth + 1)
    return any(_routes_to(getattr(app, name, None), consumer, depth + 1) for name in ("inner", "application", "app"))
