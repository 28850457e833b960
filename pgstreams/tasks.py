"""pgstreams' background work as tasks of Django's Tasks API (``django.tasks``; on Django 5.2,
the django-tasks backport), for a project to enqueue or schedule on its own backend: ``compact``
and ``partition``.

Importing this module needs one of the two; the rest of pgstreams does not.
"""

from __future__ import annotations

from typing import Any

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task

from . import maintenance, partitions


@task
def compact(closed_before: str = "1h", batch: int = 10_000) -> dict[str, Any]:
    """Fold the chunks of the streams closed before ``closed_before`` (an age such as ``1h`` or
    an ISO date) into runs, as ``manage.py pgstreams_compact`` does; what it did. Enqueue it from
    a schedule of the project's (cron, a periodic task of its backend), as often as streams close."""
    done = maintenance.compact(maintenance.parse_cutoff(closed_before), batch=batch)
    return {"streams": done.streams, "chunks": done.chunks, "runs": done.runs}


@task
def partition(ahead: int = 7) -> list[str]:
    """Make the day partitions of the chunks ahead (``partitions.ensure``), as ``manage.py
    pgstreams_partition`` does once it has converted the table; the partitions made. Enqueue it
    daily, so that each day's partition exists before its first stream."""
    return partitions.ensure(ahead)
