"""Helpers shared by the test modules (no fixtures: those are in conftest.py)."""

from __future__ import annotations

from typing import Any

from django.db import connection


def delete_chunks(stream_id: Any, start: int, stop: int) -> None:
    """Delete chunks start..stop-1 of a stream, as pruning or a retention job would."""
    with connection.cursor() as cursor:
        cursor.execute(
            'DELETE FROM pgstreams_chunk WHERE stream_id = %s AND "offset" >= %s AND "offset" < %s',
            [stream_id, start, stop],
        )
