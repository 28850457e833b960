"""Helpers shared by the test modules (no fixtures: those are in conftest.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db import connection, connections


def delete_chunks(stream_id: Any, start: int, stop: int) -> None:
    """Delete chunks start..stop-1 of a stream, as pruning or a retention job would."""
    with connection.cursor() as cursor:
        cursor.execute(
            'DELETE FROM pgstreams_chunk WHERE stream_id = %s AND "offset" >= %s AND "offset" < %s',
            [stream_id, start, stop],
        )


@contextlib.contextmanager
def database_alias(alias: str, entry: dict[str, Any]) -> Iterator[str]:
    """``settings.DATABASES[alias] = entry`` for the length of the block, usable by Django (in
    this thread) and by pgstreams' own connections; closed and removed afterwards."""
    configured = connections.configure_settings({**settings.DATABASES, alias: entry})
    settings.DATABASES[alias] = connections.settings[alias] = configured[alias]
    # Connected now: a Django test case refuses to open connections to aliases it did not set up.
    connections[alias].connect()
    try:
        yield alias
    finally:
        connections[alias].close()
        del connections[alias]
        connections.settings.pop(alias, None)
        settings.DATABASES.pop(alias, None)
