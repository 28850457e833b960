"""Settings: the one place that reads ``settings.PGSTREAMS``.

Every value is read when it is used, so ``override_settings`` takes effect at once. Each setting
has one validation rule, shared by its accessor (which raises ``ImproperlyConfigured``) and by the
system checks in ``checks.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

DEFAULTS: dict[str, Any] = {
    "NOTIFY_MODE": "buffered",
    "FLUSH_INTERVAL": 0.01,
    "POLL_INTERVAL": 1.0,
    "CHANNEL": "pgstreams",
    "MAX_CHUNK_BYTES": 65536,
    "DATABASE": "default",
    "AUTHORIZE": "pgstreams.auth.default_authorize",
    "PREPARED_STATEMENTS": True,
    "LISTEN_DATABASE": None,
    "METRICS_TOKEN": None,
    "SYNCHRONOUS_COMMIT": None,
    "READ_DATABASE": None,
    "CONNECT_TIMEOUT": 5,
    "QUERY_TIMEOUT": 5.0,
    "LISTEN_CHECK_INTERVAL": 5.0,
    "ASYNC_THREADS": 4,
}

NOTIFY_MODES = ("buffered", "per_write", "off")
# PostgreSQL's synchronous_commit values, from the one whose commit waits least to the one that
# waits most (with a synchronous standby: nothing, local flush, standby write, standby flush,
# standby replay).
SYNCHRONOUS_COMMIT_LEVELS = ("off", "local", "remote_write", "on", "remote_apply")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _identifier(value: Any) -> bool:
    return isinstance(value, str) and bool(_IDENTIFIER.match(value)) and len(value.encode()) <= 63


def _importable(path: Any) -> bool:
    if not isinstance(path, str):
        return False
    try:
        return callable(import_string(path))
    except ImportError:
        return False


# name -> (rule, what a valid value looks like)
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "NOTIFY_MODE": (lambda v: v in NOTIFY_MODES, f"one of {', '.join(map(repr, NOTIFY_MODES))}"),
    "FLUSH_INTERVAL": (_positive_number, "a positive number of seconds"),
    "POLL_INTERVAL": (_positive_number, "a positive number of seconds"),
    "CHANNEL": (
        _identifier,
        "a plain SQL identifier (letters, digits and underscores, not starting with a digit) of at most 63 bytes",
    ),
    "MAX_CHUNK_BYTES": (
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
        "a positive whole number of bytes",
    ),
    "DATABASE": (lambda v: isinstance(v, str) and v in settings.DATABASES, "a key of settings.DATABASES"),
    "AUTHORIZE": (
        _importable,
        "the dotted path of a callable(user, stream) -> bool",
    ),
    "PREPARED_STATEMENTS": (lambda v: isinstance(v, bool), "True or False"),
    "LISTEN_DATABASE": (
        lambda v: v is None or (isinstance(v, str) and v in settings.DATABASES),
        "None (use DATABASE) or a key of settings.DATABASES that connects to Postgres directly",
    ),
    "METRICS_TOKEN": (
        lambda v: v is None or (isinstance(v, str) and len(v) >= 16),
        "None or a secret of 16 characters or more",
    ),
    "SYNCHRONOUS_COMMIT": (
        lambda v: v is None or v in SYNCHRONOUS_COMMIT_LEVELS,
        f"None (the server's own setting) or one of {', '.join(map(repr, SYNCHRONOUS_COMMIT_LEVELS))}",
    ),
    "READ_DATABASE": (
        lambda v: v is None or (isinstance(v, str) and v in settings.DATABASES),
        "None (read from DATABASE) or a key of settings.DATABASES, such as a hot standby of DATABASE",
    ),
    "CONNECT_TIMEOUT": (
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 2,
        "a whole number of seconds, 2 or more (libpq's connect_timeout)",
    ),
    "QUERY_TIMEOUT": (_positive_number, "a positive number of seconds"),
    "LISTEN_CHECK_INTERVAL": (_positive_number, "a positive number of seconds"),
    "ASYNC_THREADS": (
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
        "a positive whole number of threads",
    ),
}


def _user_settings() -> dict[str, Any]:
    value = getattr(settings, "PGSTREAMS", None)
    return value if isinstance(value, dict) else {}


def get(name: str) -> Any:
    """Return setting ``name`` from ``settings.PGSTREAMS``, or its default (unvalidated)."""
    if name not in DEFAULTS:
        raise KeyError(f"unknown pgstreams setting {name!r}; the settings are {', '.join(DEFAULTS)}")
    return _user_settings().get(name, DEFAULTS[name])


def problem(name: str) -> str | None:
    """Say what is wrong with setting ``name``, or return None when it is valid."""
    value = get(name)
    rule, expected = _RULES[name]
    if rule(value):
        return None
    return f"PGSTREAMS[{name!r}] is {value!r}; it must be {expected}"


def unknown_keys() -> list[str]:
    """Keys of ``settings.PGSTREAMS`` that pgstreams does not know (most likely typos)."""
    return sorted(set(_user_settings()) - set(DEFAULTS))


# Validated values, for as long as settings.PGSTREAMS is the same object (override_settings and
# assignment replace it; setting_changed clears the cache for changes to other settings).
_validated: tuple[object, dict[str, Any]] = (object(), {})


def _valid(name: str) -> Any:
    global _validated
    source = getattr(settings, "PGSTREAMS", None)
    seen, values = _validated
    if source is seen and name in values:
        return values[name]
    error = problem(name)
    if error:
        raise ImproperlyConfigured(error)
    if source is not seen:
        _validated = seen, values = source, {}
    values[name] = get(name)
    return values[name]


@receiver(setting_changed)
def _forget_validated(**kwargs: Any) -> None:
    global _validated
    _validated = (object(), {})


def notify_mode() -> str:
    return _valid("NOTIFY_MODE")


def flush_interval() -> float:
    return float(_valid("FLUSH_INTERVAL"))


def poll_interval() -> float:
    return float(_valid("POLL_INTERVAL"))


def channel() -> str:
    return _valid("CHANNEL")


def max_chunk_bytes() -> int:
    return _valid("MAX_CHUNK_BYTES")


def database() -> str:
    return _valid("DATABASE")


def listen_database() -> str:
    """The alias of the listener's LISTEN connection: LISTEN_DATABASE, else DATABASE."""
    return _valid("LISTEN_DATABASE") or database()


def read_database() -> str:
    """The alias readers fetch chunks and stream state from: READ_DATABASE, else DATABASE."""
    return _valid("READ_DATABASE") or database()


def synchronous_commit() -> str | None:
    """The synchronous_commit level writes use when they name none; None: the server's own."""
    return _valid("SYNCHRONOUS_COMMIT")


def connect_timeout() -> int:
    """Seconds to open one of pgstreams' own connections."""
    return _valid("CONNECT_TIMEOUT")


def query_timeout() -> float:
    """Seconds a query on pgstreams' own connections may wait for its answer."""
    return float(_valid("QUERY_TIMEOUT"))


def listen_check_interval() -> float:
    """Seconds of silence after which the listener checks its LISTEN connection."""
    return float(_valid("LISTEN_CHECK_INTERVAL"))


def async_threads() -> int:
    """Threads (each with its own Django connection) that run the async API's database work."""
    return _valid("ASYNC_THREADS")


def metrics_token() -> str | None:
    return _valid("METRICS_TOKEN")


def prepared_statements() -> bool:
    return _valid("PREPARED_STATEMENTS")


def authorize() -> Callable[[Any, Any], bool]:
    return import_string(_valid("AUTHORIZE"))
