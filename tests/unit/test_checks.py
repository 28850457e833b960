"""System checks and the settings accessor: every invalid setting is reported with its id."""

from __future__ import annotations

import contextlib

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from pgstreams import checks, conf


def ids(pgstreams_settings: dict) -> list[str]:
    with override_settings(PGSTREAMS=pgstreams_settings):
        found = checks.check_settings() + checks.check_database() + checks.check_listen_database()
        return [m.id for m in found]


def test_defaults_pass() -> None:
    assert ids({}) == []
    assert conf.notify_mode() == "buffered" and conf.poll_interval() == 1.0


@pytest.mark.parametrize(
    ("setting", "check_id"),
    [
        ({"NOTIFY_MODE": "sometimes"}, "pgstreams.E002"),
        ({"FLUSH_INTERVAL": 0}, "pgstreams.E003"),
        ({"FLUSH_INTERVAL": "fast"}, "pgstreams.E003"),
        ({"POLL_INTERVAL": -1}, "pgstreams.E004"),
        ({"POLL_INTERVAL": True}, "pgstreams.E004"),
        ({"CHANNEL": "bad channel; DROP TABLE x"}, "pgstreams.E005"),
        ({"CHANNEL": "x" * 64}, "pgstreams.E005"),
        ({"CHANNEL": "1abc"}, "pgstreams.E005"),
        ({"MAX_CHUNK_BYTES": 0}, "pgstreams.E006"),
        ({"DATABASE": "nowhere"}, "pgstreams.E007"),
        ({"AUTHORIZE": "no.such.module.rule"}, "pgstreams.E008"),
        ({"AUTHORIZE": "pgstreams.conf.SETTINGS"}, "pgstreams.E008"),
        ({"PREPARED_STATEMENTS": "yes"}, "pgstreams.E009"),
        ({"LISTEN_DATABASE": "nowhere"}, "pgstreams.E010"),
        ({"METRICS_TOKEN": "short"}, "pgstreams.E011"),
        ({"SYNCHRONOUS_COMMIT": "ON"}, "pgstreams.E012"),
        ({"SYNCHRONOUS_COMMIT": "on; DROP TABLE pgstreams_chunk"}, "pgstreams.E012"),
        ({"READ_DATABASE": "nowhere"}, "pgstreams.E013"),
        ({"CONNECT_TIMEOUT": 1}, "pgstreams.E014"),
        ({"CONNECT_TIMEOUT": 2.5}, "pgstreams.E014"),
        ({"QUERY_TIMEOUT": 0}, "pgstreams.E015"),
        ({"LISTEN_CHECK_INTERVAL": None}, "pgstreams.E016"),
        ({"ASYNC_THREADS": 0}, "pgstreams.E017"),
        ({"NOTIFY_QUEUE_GUARD": 1}, "pgstreams.E025"),
        ({"NOTIFY_SHARDS": 0}, "pgstreams.E026"),
        ({"CHANNEL": "c" * 60, "NOTIFY_SHARDS": 1024}, "pgstreams.E027"),  # c...c_1023: 65 bytes
        ({"DAY_PARTITIONS": "yes"}, "pgstreams.E028"),
        ({"NOTIFY_MDOE": "off"}, "pgstreams.W001"),
    ],
)
def test_each_invalid_setting_has_its_check(setting: dict, check_id: str) -> None:
    assert ids(setting) == [check_id]


def test_invalid_settings_fail_manage_py_check_and_raise_at_use() -> None:
    with override_settings(PGSTREAMS={"NOTIFY_MODE": "sometimes"}):
        with pytest.raises(SystemCheckError, match="pgstreams.E002"):
            call_command("check")
        with pytest.raises(ImproperlyConfigured, match="'buffered', 'per_write', 'off'"):
            conf.notify_mode()


@contextlib.contextmanager
def extra_database(alias: str, settings_dict: dict):
    """settings.DATABASES with one more alias, for the length of the block (never connected)."""
    from django.conf import settings
    from django.db import connections

    saved = connections._settings
    databases = {**settings.DATABASES, alias: settings_dict}
    with override_settings(DATABASES=databases):
        connections._settings = connections.configure_settings(databases)
        connections.__dict__.pop("settings", None)  # a cached_property
        try:
            yield alias
        finally:
            connections._settings = saved
            connections.__dict__.pop("settings", None)


@pytest.fixture
def sqlite_alias():
    with extra_database("other", {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}) as alias:
        yield alias


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_a_database_that_is_not_postgres_is_e001(sqlite_alias: str) -> None:
    with override_settings(PGSTREAMS={"DATABASE": sqlite_alias}):
        [error] = checks.check_database()
    assert error.id == "pgstreams.E001" and "PostgreSQL 15 and 18 are tested" in error.hint


@pytest.fixture
def pgbouncer_alias():
    """An alias that looks like PgBouncer (port 6432)."""
    from django.conf import settings

    with extra_database("bouncer", {**settings.DATABASES["default"], "PORT": "6432", "HOST": "127.0.0.1"}) as alias:
        yield alias


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_a_listener_behind_pgbouncer_is_w002_and_listen_database_fixes_it(pgbouncer_alias: str) -> None:
    with override_settings(PGSTREAMS={"DATABASE": pgbouncer_alias}):
        assert [m.id for m in checks.check_listen_database()] == ["pgstreams.W002"]
        assert conf.listen_database() == pgbouncer_alias
    with override_settings(PGSTREAMS={"DATABASE": pgbouncer_alias, "LISTEN_DATABASE": "default"}):
        assert checks.check_listen_database() == []
        assert conf.listen_database() == "default"


def test_the_demo_routes_websockets_to_the_consumer() -> None:
    assert checks.check_websocket_routing() == []


def test_an_asgi_application_without_the_consumer_is_w003() -> None:
    with override_settings(ASGI_APPLICATION="tests.unit.test_checks.http_only_application"):
        found = checks.check_websocket_routing()
    assert [m.id for m in found] == ["pgstreams.W003"] and "URLRouter" in found[0].hint


def _make_http_only_application():
    from channels.routing import ProtocolTypeRouter, URLRouter
    from django.core.asgi import get_asgi_application

    return ProtocolTypeRouter({"http": get_asgi_application(), "websocket": URLRouter([])})


http_only_application = _make_http_only_application()
