"""Fixtures shared by the suite. Tests outside tests/unit talk to a real Postgres (embedded or
DATABASE_URL); tests/unit needs none."""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import SyncToAsync
from django.db import connection, connections
from django.db.backends.base.creation import TEST_DATABASE_PREFIX

from demo_project.servers import SERVERS, server_command
from pgstreams import appender, generations, listener, notify, partitions, threads
from tests.helpers import PARTITIONED, ROOT, end_answers_in_flight, free_port, in_thread, subprocess_database_url


@pytest.fixture(scope="session", autouse=True)
def _partitioned(django_db_setup: None, django_db_blocker: Any) -> None:
    """With ``PGSTREAMS_TEST_PARTITIONED=1``, the whole suite runs on chunks partitioned by day,
    new streams with time-ordered ids (``partitions``; as ``DAY_PARTITIONS`` makes them, whatever
    a test's settings)."""
    if PARTITIONED:
        from pgstreams.models import Stream

        with django_db_blocker.unblock():
            partitions.convert(7)
        field = Stream._meta.get_field("id")
        field.default = partitions.uuid7
        field.__dict__.pop("_get_default", None)  # Django caches the default's callable


@pytest.fixture(scope="session", autouse=True)
def _stop_background_threads(django_db_setup: None, django_db_blocker) -> Iterator[None]:
    """Close pgstreams' own connections and its pools' before pytest-django drops the test
    database (when the run made one: a run of tests that need no database, such as tests/unit,
    connects to none), and fail the session if anything else is still connected to it: the drop
    would fail on it, and something would have leaked."""
    yield
    generations.stop_thread()  # started by any generation a test started, through a view too
    listener.stop_listener()
    appender.stop_appenders()  # before the flusher: its last batch announces through it
    notify.stop_flusher()
    threads.stop_pools()
    SyncToAsync.single_thread_executor.submit(connections.close_all).result(10)  # sync_to_async's thread
    if not connection.settings_dict["NAME"].startswith(TEST_DATABASE_PREFIX):
        return
    with django_db_blocker.unblock():
        left = _other_sessions(deadline=time.monotonic() + 10)
        connections.close_all()
    if left:
        pytest.fail(
            f"still connected to the test database when the session ended: {left}; Django connections open "
            f"outside pgstreams' threads, by thread: {_open_django_connections()}",
            pytrace=False,
        )


def _open_django_connections() -> list[tuple[str, str]]:
    """Django's connections still open on threads other than pgstreams' own (the shortcut's
    request cycle tracks them): each one's thread, and its alias."""
    from pgstreams.durable import cycle

    names = {thread.ident: thread.name for thread in threading.enumerate()}
    return [
        (names.get(wrapper._thread_ident, "a thread that ended"), wrapper.alias)
        for wrapper in list(cycle._opened.wrappers)
        if wrapper.connection is not None
    ]


def _other_sessions(deadline: float) -> list[tuple[Any, ...]]:
    """The other sessions on the test database, once they have had until ``deadline`` to leave
    (a killed process's backend takes a moment to notice); terminated, so the drop can go on."""
    query = (
        "SELECT pid, application_name, backend_type, state, left(query, 80) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    with connection.cursor() as cursor:
        while True:  # bounded by the deadline
            cursor.execute(query)
            left = cursor.fetchall()
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        cursor.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [[row[0] for row in left]])
    return left


@pytest.fixture
def fresh_listener() -> Iterator[None]:
    """A listener started inside the test (so it sees the test's settings), stopped after it."""
    listener.stop_listener()
    yield
    listener.stop_listener()


@pytest.fixture
def spawn():
    """Start ``python -m tests.workers ARGS`` against the test database; all are killed after."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        env = {
            **os.environ,
            "DATABASE_URL": subprocess_database_url(),
            "DJANGO_SETTINGS_MODULE": "demo_project.settings",
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.workers", *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


@contextlib.contextmanager
def serving(
    command: list[str],
    port: int,
    first_line: str | None = None,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
) -> Iterator[str]:
    """Run ``command`` (a server of the demo's ASGI application on ``port`` of the loopback,
    against the test database, with ``env`` added to its environment, in ``cwd``) until the
    block ends; yields its host:port once it accepts."""
    env = {
        **os.environ,
        "DATABASE_URL": subprocess_database_url(),
        "DJANGO_SETTINGS_MODULE": "demo_project.settings",
        "CHAT_TOKENS_PER_SECOND": "30",
        **(env or {}),
    }
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        if first_line is not None:
            assert first_line in proc.stdout.readline()
        # Read what it says (its access log, for one) as it says it: a full pipe would stop it.
        threading.Thread(target=collections.deque, args=(proc.stdout, 0), daemon=True).start()
        deadline = time.monotonic() + 20
        while True:  # bounded: until the server accepts connections
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "the server did not start"
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def demo(workers: int = 2) -> Iterator[str]:
    """``manage.py demo`` (daphne, and its ``workers`` model workers) on a free loopback port,
    against the test database, until the block ends; yields its host:port."""
    port = free_port()
    command = [sys.executable, "manage.py", "demo", "--addrport", f"127.0.0.1:{port}", "--workers", str(workers)]
    with serving(command, port, first_line="pgstreams demo on http://127.0.0.1") as host:
        yield host


@pytest.fixture(scope="module")
def demo_process(django_db_setup: None) -> Iterator[str]:
    """The demo on a free loopback port, against the test database; one per module (a server
    keeps no state a test relies on: it reads the database afresh)."""
    with demo() as host:
        yield host


@pytest.fixture
def demo_server(demo_process: str, transactional_db: None) -> Iterator[str]:
    """The module's demo, with its user: ``manage.py demo`` made it as it started, and the end of
    each test ends the answers its workers write, then empties the test database."""
    from demo_project.chat.management.commands.demo import ensure_demo_user

    in_thread(ensure_demo_user)  # a module's browser runs an event loop in this thread
    yield demo_process
    in_thread(end_answers_in_flight)


@pytest.fixture(scope="module", params=SERVERS)
def any_server(request, django_db_setup: None) -> Iterator[str]:
    """The demo's ASGI application under each supported server in turn (daphne, uvicorn, granian),
    on a free loopback port, against the test database, with its Durable Streams endpoint open to
    anyone (DEMO_OPEN_DURABLE_STREAMS=1); one of each per module. The test's id names the server."""
    with open_server(request.param) as host:
        yield host


@pytest.fixture(scope="module")
def open_durable_server(django_db_setup: None) -> Iterator[str]:
    """The demo's ASGI application under daphne on a free loopback port, against the test
    database, with its Durable Streams endpoint open to anyone (DEMO_OPEN_DURABLE_STREAMS=1); one
    per module."""
    with open_server("daphne") as host:
        yield host


OPEN_DURABLE = {"DEMO_OPEN_DURABLE_STREAMS": "1"}


@contextlib.contextmanager
def open_server(server: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """The demo's ASGI application under ``server`` with its Durable Streams endpoint open to
    anyone (and ``env`` added to its environment), until the block ends; yields its host:port."""
    port = free_port()
    command = server_command(server, "demo_project.asgi:application", port)
    with serving(command, port, env={**OPEN_DURABLE, **(env or {})}) as host:
        yield host


@pytest.fixture(scope="session")
def replica(django_db_blocker) -> Iterator[tuple[Any, str, str]]:
    """A primary and a synchronous streaming standby (bench.replica), migrated and in
    settings.DATABASES as ``replica_primary`` and ``replica_standby``; torn down after the session.
    Yields (the pair, the primary's alias, the standby's alias)."""
    from bench.replica import ReplicaPair, installed

    with ReplicaPair() as pair, django_db_blocker.unblock(), installed(pair, "replica") as (primary, standby):
        yield pair, primary, standby


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``browser`` the tests that drive Chromium (those with a ``page``)."""
    for item in items:
        if "page" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)


@pytest.fixture
def page() -> Iterator[Any]:
    """A page of Debian's Chromium, headless, driven by Playwright (no browser is downloaded). Its
    own for each test: Playwright's sync API runs an event loop in this thread while it lives,
    where the end of the test must query the database."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"Chromium is not installed at {CHROMIUM} (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            page = browser.new_page(viewport={"width": 390, "height": 844})
            page.set_default_timeout(20_000)
            yield page
        finally:
            browser.close()
