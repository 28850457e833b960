"""Helpers shared by the test modules (fixtures are in conftest.py): where the repository is, a
free loopback port, the test database for other processes, a reader in a thread, chunks deleted
as pruning would, extra database aliases, what a LISTEN connection hears, the appender held in a
batch, the pinned Node.js packages, a database call from a thread of its own, a raw WebSocket
client, and a browser signed in to the demo."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import psutil
import psycopg
from django.conf import settings
from django.db import connection, connections
from psycopg.conninfo import make_conninfo

import pgstreams
from demo_project.workers import start_worker
from pgstreams import conf, notify
from pgstreams.types import Mark

ROOT = Path(__file__).resolve().parent.parent
# The suite runs on chunks partitioned by day, new streams with time-ordered ids (conftest.py).
PARTITIONED = os.environ.get("PGSTREAMS_TEST_PARTITIONED") == "1"
NODE = ROOT / "node"
# One package of each group node/package.json pins, to tell whether they are installed.
NODE_PACKAGES = ("@durable-streams/server-conformance-tests", "@ai-sdk/react")


def node_dir() -> Path:
    """``node/``, with the packages it pins installed (``npm ci``) if they are not yet; skips
    where there is no node."""
    import pytest

    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed: the Durable Streams suite and the AI SDK client run on node")
    if not all((NODE / "node_modules" / package).is_dir() for package in NODE_PACKAGES):
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE, check=True, timeout=600)
    return NODE


def sign_in(page, host: str) -> None:
    """Sign the browser's ``page`` in to the demo at ``host`` as its user."""
    page.goto(f"http://{host}/")
    assert "sign in as" in page.inner_text("main")  # the login page says how
    page.fill("#id_username", "demo")
    page.fill("#id_password", "demo")
    page.click("form.login button")
    page.wait_for_selector("form.ask")


def sign_in_and_ask(page, host: str, prompt: str) -> None:
    """Sign in to the demo, ask ``prompt``, and wait on the conversation's page until its answer is live."""
    sign_in(page, host)
    page.fill("#prompt", prompt)
    page.click("form.ask button")
    page.wait_for_selector("#status[data-state=live]")


def in_thread(function, *args):
    """Run a database call in another thread: Playwright's sync API runs an event loop in this one.
    The thread closes its connections as it ends; what the call raised is raised here."""
    done, failed = [], []

    def call() -> None:
        try:
            done.append(function(*args))
        except BaseException as exc:
            failed.append(exc)
        finally:
            connections.close_all()

    worker = threading.Thread(target=call)
    worker.start()
    worker.join(30)
    if failed:
        raise failed[0]
    return done[0] if done else None


class Rollback(Exception):
    """Raised inside ``transaction.atomic()`` to roll a write back."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def subprocess_database_url(settings_dict: dict[str, Any] | None = None) -> str:
    """A libpq connection string for the test database (or another DATABASES entry), for other
    processes."""
    s = settings_dict or connection.settings_dict
    return make_conninfo(
        dbname=s["NAME"],
        user=s["USER"] or None,
        password=s["PASSWORD"] or None,
        host=s["HOST"] or None,
        port=s["PORT"] or None,
    )


class Reader(threading.Thread):
    """``pgstreams.read()`` in a thread, keeping what it got (``got``, as (offset, data)), when
    the last chunk came (``last_at``) and what it raised (``error``); it stops after ``limit``
    chunks, or at the stream's end."""

    def __init__(self, stream_id: Any, *, from_offset: int = 0, limit: int | None = None, timeout: float = 30) -> None:
        super().__init__(name=f"reader-{stream_id}", daemon=True)
        self.stream_id, self.from_offset, self.limit, self.timeout = stream_id, from_offset, limit, timeout
        self.got: list[tuple[int, str]] = []
        self.last_at = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for chunk in pgstreams.read(self.stream_id, from_offset=self.from_offset, timeout=self.timeout):
                self.got.append((chunk.offset, chunk.data))
                self.last_at = time.monotonic()
                if self.limit is not None and len(self.got) >= self.limit:
                    return
        except BaseException as exc:  # reported by the test
            self.error = exc


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


class HeldAppender:
    """This process's appender held at the chunk table by another connection's SHARE lock (see
    ``appender_held``)."""

    def __init__(self, watcher: psycopg.Connection[Any]) -> None:
        self._watcher = watcher

    async def waiting(self) -> None:
        """Return once the appender waits at the table with a batch."""
        query = "SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'"
        for _ in range(500):
            if self._watcher.execute(query, [f"pgstreams appender {os.getpid()}"]).fetchone():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the appender never waited at the chunk table")

    async def queued(self, count: int) -> None:
        """Return once ``count`` appends wait in the appender's queue behind the held batch."""
        from pgstreams import appender, conf

        for _ in range(500):
            if appender.appender(conf.database()).depth() >= count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{count} appends never queued behind the held batch")


@contextlib.contextmanager
def appender_held() -> Iterator[HeldAppender]:
    """Hold the inserts of chunks until the block ends: a batch the appender sends meanwhile waits
    at the table, and the appends made while it waits go together in the next batch."""
    from pgstreams import conf, db

    kwargs = db.connect_kwargs(conf.database(), "test")
    with psycopg.connect(**kwargs) as holder, psycopg.connect(**kwargs) as watcher, holder.transaction():
        holder.execute("LOCK TABLE pgstreams_chunk IN SHARE MODE")
        yield HeldAppender(watcher)


class Heard(NamedTuple):
    """One notification: the backend that sent it, its channel and its marks (of the streams
    asked about)."""

    pid: int
    channel: str
    marks: list[Mark]


def listen_everywhere(conn: psycopg.Connection[Any]) -> None:
    """LISTEN on every notification channel of pgstreams (each shard's, with NOTIFY_SHARDS)."""
    from psycopg import sql

    for shard in range(conf.notify_shards()):
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(notify.channel_of(shard))))


def heard(
    conn: psycopg.Connection[Any],
    streams: Iterable[uuid.UUID],
    *,
    until: Callable[[list[Heard]], bool],
    timeout: float = 10.0,
    linger: float = 0.0,
) -> list[Heard]:
    """The notifications about ``streams`` that arrive on ``conn`` (which LISTENs on pgstreams'
    channels: ``listen_everywhere``), until ``until(heard)`` holds, then ``linger`` seconds more
    (to catch one sent twice), or until ``timeout``. Notifications about other streams, which
    any writer of the database may send, are left out. It waits with select() and reads with
    libpq's own calls: psycopg's ``notifies(timeout=...)`` was once seen here to go on waiting on
    an idle socket for ever."""
    wanted = set(streams)
    got: list[Heard] = []
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if select.select([conn.pgconn.socket], [], [], min(left, 0.1))[0]:
            conn.pgconn.consume_input()
        while (note := conn.pgconn.notifies()) is not None:
            marks = [m for m in notify.decode(note.extra.decode()) if m.stream_id in wanted]
            if marks:
                got.append(Heard(note.be_pid, note.relname.decode(), marks))
        if deadline - time.monotonic() > linger and until(got):
            deadline = time.monotonic() + linger
    return got


class RawWebSocket:
    """A client that speaks just enough WebSocket to open a socket and send text frames, and
    never reads what the server sends (after the handshake): the hostile client of the memory
    tests, whose unread data piles up on the server unless the server stops sending."""

    def __init__(self, host: str, path: str) -> None:
        address, port = host.rsplit(":", 1)
        self.sock = socket.create_connection((address, int(port)), timeout=10)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nOrigin: http://{host}\r\n\r\n".encode()
        )
        response = b""
        while b"\r\n\r\n" not in response and len(response) < 4096:
            response += self.sock.recv(1)  # the handshake only, byte by byte: nothing past it
        if not response.startswith(b"HTTP/1.1 101"):
            raise ConnectionError(f"no WebSocket: {response[:80]!r}")

    def send_text(self, text: str) -> None:
        self._send(0x1, text.encode())

    def _send(self, opcode: int, payload: bytes) -> None:
        """One final frame, masked as a client's must be."""
        assert len(payload) < 126
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + masked)

    def read_to_end(self, timeout: float = 10) -> bytes:
        """Everything the server sent after the handshake, up to its end of stream (or timeout).
        A close frame among it is answered with one, as the closing handshake asks: a server
        that waits for that answer before it closes the socket (uvicorn) need not time out."""
        self.sock.settimeout(timeout)
        data = b""
        replied = False
        for _ in range(100_000):  # bounded: the server closes, or recv times out
            try:
                part = self.sock.recv(65536)
            except (TimeoutError, OSError):
                break
            if not part:
                break
            data += part
            if not replied and (close := _close_frame(data)) is not None:
                replied = True
                with contextlib.suppress(OSError):  # the server may have closed already
                    self._send(0x8, close[:2])
        return data

    def close(self) -> None:
        self.sock.close()


def _close_frame(data: bytes) -> bytes | None:
    """The payload of the first close frame in ``data`` (the unmasked frames a server sends, from
    the first), or None when there is none yet."""
    at = 0
    while at + 2 <= len(data):
        opcode, length, head = data[at] & 0x0F, data[at + 1] & 0x7F, 2
        if length == 126:
            length, head = int.from_bytes(data[at + 2 : at + 4], "big"), 4
        elif length == 127:
            length, head = int.from_bytes(data[at + 2 : at + 10], "big"), 10
        if at + head + length > len(data):
            return None  # the rest of the frame is still to come
        if opcode == 0x8:
            return data[at + head : at + head + length]
        at += head + length
    return None


class ServerMemory:
    """The resident memory of the server the test started at ``host``: its processes (granian's
    worker is a child of its own) are found once, by the port they listen on, and summed at each
    ``rss()`` (looking for them takes longer than reading their memory)."""

    def __init__(self, host: str) -> None:
        port = int(host.rsplit(":", 1)[1])
        for server in psutil.Process().children():
            processes = [server, *server.children(recursive=True)]
            if any(
                c.status == psutil.CONN_LISTEN and c.laddr.port == port for p in processes for c in p.net_connections()
            ):
                self.processes = processes
                return
        raise AssertionError(f"no server of this test listens at {host}")

    def rss(self) -> int:
        return sum(p.memory_info().rss for p in self.processes)


def response_head(sock: socket.socket) -> bytes:
    """An HTTP response's status line and headers, read byte by byte: nothing past them."""
    head = b""
    while b"\r\n\r\n" not in head and len(head) < 4096:  # bounded; recv times out with the socket
        part = sock.recv(1)
        if not part:
            break
        head += part
    return head


def running_worker(stream_id: Any, timeout: float = 10.0) -> str:
    """The id of the ``db_worker`` running the generation of stream ``stream_id`` now, as the
    task's result records it; waits (bounded) for one to start it."""
    from django_tasks_db.models import DBTaskResult

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # bounded
        result = DBTaskResult.objects.filter(status="RUNNING", args_kwargs__args__0=str(stream_id)).first()
        if result is not None and result.worker_ids:
            return result.worker_ids[-1]
        time.sleep(0.02)
    raise AssertionError(f"no worker runs the generation of stream {stream_id}")


def worker_processes() -> dict[str, psutil.Process]:
    """The ``db_worker`` processes running on this machine (a killed one, a zombie until its
    parent reaps it, is not), by worker id."""
    found = {}
    for process in psutil.process_iter(["cmdline", "status"]):
        arguments = process.info["cmdline"] or []
        if process.info["status"] == psutil.STATUS_ZOMBIE or "db_worker" not in arguments:
            continue
        if "--worker-id" in arguments[:-1]:
            found[arguments[arguments.index("--worker-id") + 1]] = process
    return found


def end_answers_in_flight(timeout: float = 10.0) -> None:
    """Close every open stream, then wait (bounded) until no live ``db_worker`` runs a task: a
    worker's transaction under way while a test's flush truncates the tables can deadlock it
    (``take()`` and an append lock the stream, producer and chunk tables in another order)."""
    from django_tasks_db.models import DBTaskResult

    from pgstreams.models import Stream

    for stream_id in Stream.objects.filter(closed_at__isnull=True).values_list("id", flat=True):
        with contextlib.suppress(pgstreams.StreamClosed, pgstreams.StreamNotFound):
            pgstreams.close(stream_id)
    live = worker_processes()
    deadline = time.monotonic() + timeout
    while any(r.worker_ids and r.worker_ids[-1] in live for r in DBTaskResult.objects.filter(status="RUNNING")):
        assert time.monotonic() < deadline, "a worker still runs a task of a closed stream"
        time.sleep(0.02)


class Workers:
    """``manage.py db_worker`` processes, named by their worker ids."""

    def __init__(self, count: int, cwd: Path = ROOT, env: dict[str, str] | None = None) -> None:
        """``count`` workers of the demo (or, given ``cwd`` and ``env``, of another project)."""
        env = {
            **os.environ,
            "DATABASE_URL": subprocess_database_url(),
            "DJANGO_SETTINGS_MODULE": "demo_project.settings",
            **(env or {}),
        }
        self.processes = {
            f"worker-{i}": start_worker(f"worker-{i}", interval=0.05, env=env, cwd=cwd) for i in range(count)
        }

    def running(self, stream: Any) -> subprocess.Popen[bytes]:
        """The worker running ``stream``'s generation now."""
        return self.processes[running_worker(stream.id)]

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
            process.wait(10)


def make_project(folder: Path, files: dict[str, str], extra_settings: str = "") -> dict[str, str]:
    """A Django project as a reader makes it from the docs: ``startproject`` of the project whose
    settings are among ``files`` (its text appended to what startproject wrote, then
    ``extra_settings`` and the test database in place of the project's), and the other files,
    each app a package. Returns the environment its commands need (pgstreams from this checkout,
    its settings)."""
    (name,) = [path.split("/")[0] for path in files if path.endswith("/settings.py")]
    subprocess.run([sys.executable, "-m", "django", "startproject", name, str(folder)], check=True, timeout=60)
    for path, text in files.items():
        if path != f"{name}/settings.py":
            target = folder / path
            target.parent.mkdir(parents=True, exist_ok=True)
            (folder / path.split("/")[0] / "__init__.py").touch()
            target.write_text(text)
    database = {key: connection.settings_dict[key] for key in ("NAME", "USER", "PASSWORD", "HOST", "PORT")}
    database["ENGINE"] = "django.db.backends.postgresql"  # the embedded server's socket, when it is that
    with (folder / name / "settings.py").open("a") as settings_file:
        settings_file.write(
            f"\n{files[f'{name}/settings.py']}\n{extra_settings}\nDATABASES = {{'default': {database!r}}}\n"
        )
    return {"PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": f"{name}.settings"}
