"""Connections of pgstreams' own (listener, fetcher, flusher), made from a Django database alias.

The only module that turns ``settings.DATABASES`` into psycopg connection arguments. The write
path does not come here: it runs on Django's own connection, inside the caller's transaction.
"""

from __future__ import annotations

import os
import random
from typing import Any

import psycopg
from django.db import connections

# Django's connection arguments that only make sense for Django's own cursors.
_DJANGO_ONLY = ("cursor_factory", "context")


def connect_kwargs(alias: str, role: str) -> dict[str, Any]:
    """psycopg.connect() arguments for ``alias``, in autocommit, named for pg_stat_activity.

    ``role`` ("listener", "fetcher", "flusher") goes into ``application_name`` with the pid, so
    an operator can see which process holds which backend.
    """
    wrapper = connections[alias]
    if wrapper.vendor != "postgresql":
        raise psycopg.NotSupportedError(f"pgstreams needs PostgreSQL; database {alias!r} is {wrapper.vendor}")
    params = wrapper.get_connection_params()
    for key in _DJANGO_ONLY:
        params.pop(key, None)
    params["application_name"] = f"pgstreams {role} {os.getpid()}"
    params["autocommit"] = True
    return params


def connect(alias: str, role: str) -> psycopg.Connection[Any]:
    return psycopg.Connection.connect(**connect_kwargs(alias, role))


async def aconnect(alias: str, role: str) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(**connect_kwargs(alias, role))


class Backoff:
    """Exponential delays with full jitter, for reconnect loops: 0.05 s doubling up to ``cap``."""

    def __init__(self, first: float = 0.05, cap: float = 2.0) -> None:
        self.first = first
        self.cap = cap
        self.attempt = 0

    def next(self) -> float:
        delay = min(self.cap, self.first * 2**self.attempt)
        self.attempt += 1
        return random.uniform(delay / 2, delay)

    def reset(self) -> None:
        self.attempt = 0
