"""Faults: the server stopped and started mid-stream, the flusher's connection failing, a
WebSocket client that stops reading, and hundreds of WebSockets on one daphne process.

Run alone with ``python -m pytest -m faults`` (with the writer kill and listener termination
tests of test_processes.py). Each test asserts the exact committed sequence for every reader and
reports the catch-up time (``-rP`` shows it)."""

from __future__ import annotations

import asyncio
import json
import queue
import random
import socket
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable
from functools import partial

import httpx
import pytest
import websockets
from asgiref.sync import SyncToAsync
from django.core.management import call_command
from django.db import connection, connections

import pgstreams
from bench.pgserver import ServerControl
from bench.proxy import database_via, proxy_for
from demo_project.servers import SERVERS
from pgstreams import notify
from pgstreams.models import Chunk, Stream
from tests.conftest import open_server
from tests.helpers import RawWebSocket, Reader, ServerMemory, response_head, subprocess_database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess, pytest.mark.faults, pytest.mark.slow]


def committed(stream_id) -> list[tuple[int, str]]:
    return list(Chunk.objects.filter(stream_id=stream_id).order_by("offset").values_list("offset", "data"))


def _forget_dead_connections() -> None:
    """The server restart killed every connection of this process: close Django's, in this
    thread and in the thread sync_to_async runs in, and start a new flusher, so the tests after
    this one start clean (a Django project does the same at each request)."""
    connections.close_all()
    SyncToAsync.single_thread_executor.submit(connections.close_all).result(10)
    notify.stop_flusher()


@pytest.mark.usefixtures("fresh_listener")
def test_the_server_stopped_and_started_mid_stream_loses_nothing(spawn) -> None:
    server = ServerControl(connection.settings_dict)
    if server.why_not:
        pytest.skip(server.why_not)
    s = pgstreams.create_stream()
    readers = [Reader(s.id, timeout=90) for _ in range(3)]
    for r in readers:
        r.start()
    proc = spawn("retrying", "--stream", str(s.id), "--count", "300", "--pause", "0.01")
    time.sleep(1.0)  # mid-stream
    server.stop()
    time.sleep(1.0)  # down: writes fail, the listener cannot reconnect
    server.start()
    up_at = time.monotonic()
    _forget_dead_connections()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    summary, errors = lines[-1], lines[:-1]
    assert summary["done"] == 300
    # The writes cut off got a clear exception, Django's own, never a silent drop...
    assert errors and all(
        e["error"] in ("django.db.utils.OperationalError", "django.db.utils.InterfaceError") for e in errors
    )
    # ...and their retries succeeded: every chunk is in the table, in order. A write whose commit
    # succeeded but whose reply was lost is in it twice (at least once, as the writer retried).
    truth = committed(s.id)
    assert [o for o, _ in truth] == list(range(len(truth)))
    assert list(dict.fromkeys(d for _, d in truth)) == [f"r{i}" for i in range(300)]
    for r in readers:
        r.join(60)
        assert r.error is None and not r.is_alive()
        assert r.got == truth
    catch_up = max(r.last_at for r in readers) - up_at
    print(f"restart: {len(errors)} write(s) cut off and retried; readers complete {catch_up:.2f} s after the start")


def test_appends_through_a_server_restart_wait_for_it_and_commit_once() -> None:
    """The server stopped for 1 s while 20 tasks append: the batches that could not connect or
    commit are sent again once it is back, within the retry budget; none is split as if an item
    had been refused, and every stream holds exactly what its callers were told."""
    from pgstreams import appender

    server = ServerControl(connection.settings_dict)
    if server.why_not:
        pytest.skip(server.why_not)
    appender.stop_appenders()
    streams = [pgstreams.create_stream().id for _ in range(20)]
    told: dict[int, list[str]] = {k: [] for k in range(20)}
    errors: list[BaseException] = []

    async def appends(k: int) -> None:
        for i in range(100):
            try:
                await pgstreams.aappend(streams[k], f"{k}-{i}")
                told[k].append(f"{k}-{i}")
            except pgstreams.StreamError as exc:
                errors.append(exc)
            await asyncio.sleep(0.02)

    def restart() -> None:
        time.sleep(0.5)
        server.stop()
        time.sleep(1.0)
        server.start()

    before = appender.appender("default").stats.snapshot()
    thread = threading.Thread(target=restart)
    thread.start()

    async def load() -> None:
        await asyncio.gather(*(appends(k) for k in range(20)))

    try:
        asyncio.run(load())
    finally:
        thread.join(120)
        _forget_dead_connections()
    stats = appender.appender("default").stats - before
    appender.stop_appenders()
    print(f"restart: {stats.retries} batch(es) sent again, {stats.resolved} resolved, {len(errors)} errors")
    assert errors == [] and stats.splits == 0 and stats.retries >= 1
    for k, sid in enumerate(streams):
        assert committed(sid) == list(enumerate(told[k])) and len(told[k]) == 100


@pytest.mark.usefixtures("fresh_listener")
def test_a_failing_flusher_drops_counts_and_polling_delivers(spawn) -> None:
    s = pgstreams.create_stream()
    readers = [Reader(s.id, timeout=30) for _ in range(2)]
    for r in readers:
        r.start()
    proc = spawn("steady", "--stream", str(s.id), "--count", "600", "--pause", "0.005")
    killed = 0
    deadline = time.monotonic() + 20
    while proc.poll() is None and killed < 10 and time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                [f"pgstreams flusher {proc.pid}"],
            )
            killed += sum(1 for (ok,) in cursor.fetchall() if ok)
        time.sleep(0.1)
    out, err = proc.communicate(timeout=60)
    written_at = time.monotonic()
    assert proc.returncode == 0, err
    stats = json.loads(out.splitlines()[-1])["flusher"]
    assert killed >= 3
    assert stats["failed_flushes"] >= 1 and stats["dropped"] >= 1
    for r in readers:
        r.join(30)
        assert r.error is None
        assert r.got == [(i, f"s{i}") for i in range(600)]
    catch_up = max(0.0, max(r.last_at for r in readers) - written_at)
    print(f"flusher killed {killed} times: {stats}; readers complete {catch_up:.2f} s after the writer finished")


async def _follow(
    url: str, origin: str, got: list, stop_reading_after: int | None = None, opened: asyncio.Event | None = None
) -> None:
    async with websockets.connect(url, origin=origin, max_queue=1, open_timeout=20) as ws:
        if opened is not None:
            opened.set()
        async for raw in ws:
            message = json.loads(raw)
            if message["type"] == "end":
                return
            got.extend((i["offset"], i["data"], time.monotonic()) for i in message["items"])
            if stop_reading_after is not None and len(got) >= stop_reading_after:
                await asyncio.sleep(3600)  # stops reading (and acking); cancelled by the test
            try:
                await ws.send(json.dumps({"type": "ack", "frame": message["frame"]}))
            except websockets.ConnectionClosedOK:
                pass  # closed after the end frame, which is still to be read


@pytest.mark.parametrize("server", SERVERS)
def test_a_websocket_client_that_stops_reading_holds_bounded_server_memory(server: str) -> None:
    # Each memory test has a server of its own: one whose heap grew in an earlier test would
    # reuse that memory and hide the growth being measured.
    with open_server(server) as host:
        asyncio.run(_stalled_client(host, server))


async def _until_set(events: list[asyncio.Event], tasks: list[asyncio.Task], timeout: float) -> None:
    """Return once every event is set; a task that ended meanwhile raises its error, and after
    ``timeout`` AssertionError."""
    deadline = time.monotonic() + timeout
    while not all(e.is_set() for e in events):  # bounded by the deadline
        for task in tasks:
            if task.done():
                task.result()
        assert time.monotonic() < deadline, "not set in time"
        await asyncio.sleep(0.01)


async def _stalled_client(host: str, name: str) -> None:
    s = await pgstreams.acreate_stream()
    url, origin = f"ws://{host}/ws/pgstreams/{s.id}/", f"http://{host}"
    stalled, healthy = [], []
    opened = [asyncio.Event(), asyncio.Event()]
    slow = asyncio.create_task(_follow(url + "?from=0", origin, stalled, stop_reading_after=10, opened=opened[0]))
    fast = asyncio.create_task(_follow(url + "?from=0", origin, healthy, opened=opened[1]))
    await _until_set(opened, [slow, fast], timeout=30)  # both sockets open before the baseline
    server = ServerMemory(host)
    before = server.rss()
    chunk = "x" * 10_000
    total, written_at, peak = 6000, {}, before
    for _ in range(0, total, 100):  # 60 MB, far more than any window
        offsets = await pgstreams.awrite_many(s.id, [chunk] * 100)
        written_at.update(dict.fromkeys(offsets, time.monotonic()))
        peak = max(peak, server.rss())
        await asyncio.sleep(0.02)
    await pgstreams.aclose(s.id)
    await asyncio.wait_for(fast, 120)
    peak = max(peak, server.rss())
    growth_mib = (peak - before) / 2**20
    # The healthy reader got everything, in order, while the other one sat on a full window.
    assert [o for o, _, _ in healthy] == list(range(total))
    lags = sorted(t - written_at[o] for o, _, t in healthy)
    assert len(stalled) < total
    # The server holds at most the stalled client's window (1 MiB) and socket buffers, not 60 MB.
    assert growth_mib < 25, f"the server grew {growth_mib:.1f} MiB"
    slow.cancel()
    # The stalled client reconnects and resumes after the last offset it has.
    resumed: list = []
    await asyncio.wait_for(_follow(url + f"?from={stalled[-1][0] + 1}", origin, resumed), 60)
    assert [o for o, _, _ in stalled + resumed] == list(range(total))
    print(
        f"stalled client: {name} grew {growth_mib:.1f} MiB while 60 MB were written; healthy reader "
        f"lag p50 {lags[len(lags) // 2] * 1000:.0f} ms, p99 {lags[int(len(lags) * 0.99)] * 1000:.0f} ms"
    )


def test_300_websockets_on_one_daphne_process_lose_nothing(tmp_path) -> None:
    out = tmp_path / "ws.json"
    call_command(
        "pgstreams_bench",
        "--mode",
        "buffered",
        "--readers",
        "0",
        "--writers",
        "8",
        "--duration",
        "3",
        "--ws",
        "--clients",
        "300",
        "--no-pgbench",
        "--json",
        str(out),
    )
    ws = json.loads(out.read_text())["ws"]
    assert ws["clients"] == 300 and ws["errors"] == []
    assert ws["coverage"] == 1.0 and ws["duplicates"] == 0 and ws["out_of_order"] == 0
    print(f"300 WebSockets: {ws['delivered_per_s']:.0f} chunks/s, e2e {ws['e2e_ms']}, peak {ws['server_peak_mib']} MiB")


class Lines:
    """The JSON lines a worker prints, read in a thread so the test can wait with a deadline."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.queue: queue.Queue[dict] = queue.Queue()
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        for line in proc.stdout:
            self.queue.put(json.loads(line))

    def until(self, predicate, timeout: float) -> dict:
        """The first line for which ``predicate`` holds; AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.queue.get(timeout=left)
            except queue.Empty:
                break
            if predicate(line):
                return line
        raise AssertionError(f"nothing matching within {timeout} s")


def own_backends(pid: int) -> set[str]:
    """The roles of the pgstreams connections process ``pid`` holds."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT split_part(application_name, ' ', 2) FROM pg_stat_activity WHERE application_name LIKE %s",
            [f"pgstreams % {pid}"],
        )
        return {role for (role,) in cursor.fetchall()}


def connected(pid: int) -> None:
    """Wait until process ``pid`` has its listener's, fetcher's and flusher's connections."""
    deadline = time.monotonic() + 20
    while own_backends(pid) != {"listener", "fetcher", "flusher"}:
        assert time.monotonic() < deadline, own_backends(pid)
        time.sleep(0.05)


# The frozen process's limits: the defaults are 5 s each; what they bound scales with them.
FROZEN_LIMITS = {"LISTEN_CHECK_INTERVAL": 1.0, "QUERY_TIMEOUT": 2.0}


@pytest.mark.usefixtures("fresh_listener")
def test_connections_frozen_mid_stream_are_given_up_and_readers_catch_up(spawn) -> None:
    """A failover whose old primary vanishes leaves connections that stay open and never answer:
    a proxy stops forwarding on every open connection of a reader process, without closing
    them, while new connections pass. The reader must get chunks written after the freeze within
    LISTEN_CHECK_INTERVAL + QUERY_TIMEOUT + 5 s (15 s with the defaults; the process runs with
    both shortened, FROZEN_LIMITS, the bounds scaling with them), and its flusher and its exit
    must not hang."""
    r, w = pgstreams.create_stream(), pgstreams.create_stream()
    with proxy_for(connection.settings_dict) as proxy:
        via = subprocess_database_url(database_via(proxy, connection.settings_dict))
        limits = [f"--setting={key}={value}" for key, value in FROZEN_LIMITS.items()]
        proc = spawn("via", "--stream", str(r.id), "--write-stream", str(w.id), "--via", via, *limits)
        lines = Lines(proc)
        pgstreams.write(r.id, "c0")
        lines.until(lambda m: m.get("data") == "c0", 20)
        proc.stdin.write("write w0\n")
        proc.stdin.flush()
        connected(proc.pid)
        assert proxy.freeze() == 3  # the listener's, the fetcher's and the flusher's connections

        frozen_at = time.monotonic()
        for i in range(1, 6):
            pgstreams.write(r.id, f"c{i}")
        proc.stdin.write("write w1\n")  # its flush waits on a frozen connection
        proc.stdin.flush()
        delivered_at = lines.until(lambda m: m.get("data") == "c5", 30)["at"]

        # Frozen again while a flush is under way: exit must not wait on the connection.
        proc.stdin.write("write w2\n")  # flushed through a new connection
        proc.stdin.flush()
        lines.until(lambda m: m.get("wrote") == 2, 10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            proc.stdin.write("stats\n")
            proc.stdin.flush()
            if lines.until(lambda m: "flusher" in m, 10)["flusher"]["flushes"] >= 2:
                break
            time.sleep(0.1)
        connected(proc.pid)
        proxy.freeze()
        proc.stdin.write("write w3\nexit\n")
        proc.stdin.flush()
        stats = lines.until(lambda m: "flusher" in m, 10)
        proc.wait(30)
        exited_after = time.monotonic() - stats["exiting_at"]
    assert proc.returncode == 0, proc.stderr.read()
    caught_up = delivered_at - frozen_at
    print(
        f"frozen connections: readers got chunks written after the freeze {caught_up:.2f} s later; "
        f"the process exited {exited_after:.2f} s after being asked, with a flush waiting on a frozen connection; "
        f"flusher {stats['flusher']}"
    )
    check, query = FROZEN_LIMITS["LISTEN_CHECK_INTERVAL"], FROZEN_LIMITS["QUERY_TIMEOUT"]
    # A flush still hanging at exit would be given up only after the join's CONNECT_TIMEOUT (5 s)
    # + QUERY_TIMEOUT + 1 s; the watchdog gives it up after QUERY_TIMEOUT.
    assert caught_up < check + query + 5 and exited_after < query + 3.5
    assert stats["flusher"]["failed_flushes"] >= 1  # the flush that hung was given up...
    assert stats["flusher"]["flushes"] >= 2  # ...and the next ones went through a new connection


@pytest.mark.parametrize("server", SERVERS)
def test_a_client_that_acks_without_reading_holds_bounded_server_memory(server: str) -> None:
    """The lying client: a raw socket that acknowledges everything every 50 ms and never reads,
    while 50 MB are written to its stream. Acks that are not backed by reading must not open
    the window: an ack that names no frame the client read is refused (4400) and the socket
    closed, so the server holds nothing for it, under daphne (which has no backpressure) as
    under uvicorn and granian (which have). A client that reads nothing and acks nothing holds one window:
    test_a_websocket_client_that_stops_reading_holds_bounded_server_memory."""
    with open_server(server) as host:
        asyncio.run(_lying_client(host, server))


async def _lying_client(host: str, name: str) -> None:
    s = await pgstreams.acreate_stream()
    liar = RawWebSocket(host, f"/ws/pgstreams/{s.id}/")
    lying = True
    acked = asyncio.Event()

    async def ack_forever() -> None:
        while lying:
            try:
                await asyncio.to_thread(liar.send_text, json.dumps({"type": "ack", "offset": 10**15}))
            except OSError:
                return  # the server closed the socket
            acked.set()
            await asyncio.sleep(0.05)

    acks = asyncio.create_task(ack_forever())
    await _until_set([acked], [acks], timeout=10)  # it lies from before the baseline
    server = ServerMemory(host)
    before = peak = server.rss()
    chunk = "x" * 10_000
    for _ in range(0, 5000, 100):  # 50 MB
        await pgstreams.awrite_many(s.id, [chunk] * 100)
        peak = max(peak, server.rss())
        await asyncio.sleep(0.02)
    await asyncio.sleep(1.0)
    peak = max(peak, server.rss())
    lying = False
    await acks
    answer = await asyncio.to_thread(liar.read_to_end)
    liar.close()
    growth_mib = (peak - before) / 2**20
    # Its acks name no frame it read: the server refused them and closed the socket.
    assert b'"code": 4400' in answer and b"the only client message" in answer
    print(f"lying client: {name} grew {growth_mib:.1f} MiB while 50 MB were written to its stream")
    assert growth_mib < 25


@pytest.mark.parametrize("server", SERVERS)
def test_a_durable_streams_sse_client_that_stops_reading_holds_bounded_server_memory(server: str) -> None:
    """A raw socket (a 4 KiB receive buffer) opens a Durable Streams SSE answer at the tail of a
    stream and never reads, while 48 MB are written to it: the answer ends after SSE_BYTES, so
    the server holds about that much for it, not all that was written (it held all of it)."""
    with open_server(server) as host:
        asyncio.run(_silent_sse_client(host, server))


async def _silent_sse_client(host: str, name: str) -> None:
    address, port = host.rsplit(":", 1)
    s = await pgstreams.acreate_stream(path="silent/sse")
    sock = socket.create_connection((address, int(port)), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    request = f"GET /pgstreams/v1/stream/silent/sse?offset=now&live=sse HTTP/1.1\r\nHost: {host}\r\n\r\n"
    sock.sendall(request.encode())
    head = await asyncio.to_thread(response_head, sock)  # the answer is open; its body stays unread
    assert head.startswith(b"HTTP/1.1 200"), head
    server = ServerMemory(host)
    before = peak = server.rss()
    chunk = "x" * 10_000
    for _ in range(0, 4800, 100):  # 48 MB
        await pgstreams.awrite_many(s.id, [chunk] * 100)
        peak = max(peak, server.rss())
        await asyncio.sleep(0.02)
    await asyncio.sleep(1.0)
    peak = max(peak, server.rss())
    sock.close()
    growth_mib = (peak - before) / 2**20
    print(f"silent Durable Streams SSE client: {name} grew {growth_mib:.1f} MiB while 48 MB were written")
    assert growth_mib < 25


class AppenderKiller:
    """While its block runs, a thread terminates the backends of every appender of the test
    database (``application_name`` 'pgstreams appender ...', in any process) at random moments,
    5 to 50 ms apart: at most 400 kills, for at most 120 s. ``kills`` counts them."""

    def __init__(self, seed: int) -> None:
        self.rng, self.kills = random.Random(seed), 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="test-appender-killer")

    def __enter__(self) -> AppenderKiller:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(10)

    def _run(self) -> None:
        deadline = time.monotonic() + 120
        with connections["default"].cursor() as cursor:
            while not self.done.is_set() and self.kills < 400 and time.monotonic() < deadline:
                time.sleep(self.rng.uniform(0.005, 0.05))
                cursor.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name LIKE 'pgstreams appender %%'"
                )
                self.kills += cursor.fetchone()[0]
        connections["default"].close()


def test_the_appenders_backend_killed_under_load_loses_and_doubles_nothing(settings) -> None:
    """Appends from 50 tasks (40 aappend loops, 10 stream writers) while another connection
    terminates the appender's backend at random moments: each stream holds exactly what its
    writer was told was committed, in order, once. Its batches go APPEND_INTERVAL (5 ms here,
    20 ms by default) after the previous one began: the aappend loops wait for each commit, so
    the interval, not the kills, set how long the test took."""
    from pgstreams import appender

    settings.PGSTREAMS = {**settings.PGSTREAMS, "APPEND_INTERVAL": 0.005}
    appender.stop_appenders()
    streams = [pgstreams.create_stream().id for _ in range(50)]
    per_stream = 200
    told: dict[int, list[str]] = {k: [] for k in range(50)}  # what callers were told committed
    errors: list[BaseException] = []

    async def appends(k: int) -> None:
        for i in range(per_stream):
            try:
                await pgstreams.aappend(streams[k], f"{k}-{i}")
                told[k].append(f"{k}-{i}")
            except pgstreams.StreamError as exc:
                errors.append(exc)

    async def writes(k: int) -> None:
        try:
            async with pgstreams.stream_writer(streams[k]) as w:
                for i in range(per_stream):
                    await w.send(f"{k}-{i}")
                    await asyncio.sleep(0.001)
            told[k].extend(f"{k}-{i}" for i in range(per_stream))
        except pgstreams.StreamError as exc:
            errors.append(exc)

    async def load() -> None:
        await asyncio.gather(*(appends(k) for k in range(40)), *(writes(k) for k in range(40, 50)))

    before = appender.appender("default").stats.snapshot()
    started = time.monotonic()
    with AppenderKiller(seed=13) as killer:
        asyncio.run(load())
    took, kills = time.monotonic() - started, killer.kills
    stats = appender.appender("default").stats - before
    print(
        f"{50 * per_stream} appends in {took:.1f} s with {kills} backend kills: {stats.batches} batches committed, "
        f"{stats.retries} sent again after they did not commit, {stats.resolved} found committed after a commit "
        f"without answer; {len(errors)} errors"
    )
    assert kills >= 20
    assert errors == []
    for k, sid in enumerate(streams):
        assert committed(sid) == list(enumerate(told[k]))
        assert len(told[k]) == per_stream
    appender.stop_appenders()


async def until_answered(send: Callable[[], Awaitable[httpx.Response]]) -> tuple[int, int]:
    """``send()`` again after any error or 5xx, as a retrying client does, at most 100 times: the
    status it was answered with at last, and the tries it took."""
    for tries in range(1, 101):
        try:
            answer = await send()
        except httpx.HTTPError:
            answer = None
        if answer is not None and answer.status_code < 500:
            return answer.status_code, tries
        await asyncio.sleep(0.02)
    raise AssertionError("no answer below 500 in 100 tries")


def test_http_appends_as_producers_through_appender_kills_are_stored_exactly_once(open_durable_server: str) -> None:
    """40 clients append 50 chunks each over HTTP to a daphne process as idempotent producers
    (Producer-Id/Epoch/Seq), each sending the same request again after any error or 5xx, while
    the appender's backend is terminated at random moments: every stream holds each chunk once,
    in order, and every acknowledged append is there."""
    streams, per_stream = 40, 50
    base = f"http://{open_durable_server}/pgstreams/v1/stream/faults-producers"
    retried = 0

    async def produce(client: httpx.AsyncClient, k: int) -> list[int]:
        nonlocal retried
        statuses = []
        for seq in range(per_stream):
            headers = {"Content-Type": "text/plain", "Producer-Id": f"p{k}", "Producer-Epoch": "0"}
            headers["Producer-Seq"] = str(seq)
            status, tries = await until_answered(
                partial(client.post, f"{base}/{k}", content=f"{k}-{seq};", headers=headers)
            )
            statuses.append(status)
            retried += tries - 1
        return statuses

    async def load() -> list[list[int]]:
        async with httpx.AsyncClient(timeout=30) as client:
            for k in range(streams):
                assert (await client.put(f"{base}/{k}", headers={"Content-Type": "text/plain"})).status_code == 201
            with AppenderKiller(seed=23) as killer:
                answers = await asyncio.gather(*(produce(client, k) for k in range(streams)))
            print(
                f"{streams * per_stream} producer appends over HTTP with {killer.kills} appender backend kills: "
                f"{retried} requests sent again"
            )
            assert killer.kills >= 20
            return answers

    answers = asyncio.run(load())
    for k in range(streams):
        assert set(answers[k]) <= {200, 204} and len(answers[k]) == per_stream  # 204: a retried duplicate
        sid = Stream.objects.get(path=f"faults-producers/{k}").id
        assert committed(sid) == [(seq, f"{k}-{seq};") for seq in range(per_stream)]


def test_http_creates_through_appender_kills_are_each_made_once_and_every_201_is_there(
    open_durable_server: str,
) -> None:
    """40 clients create 25 streams each over HTTP (plain PUTs, committed in the appender's
    batches) on a daphne process, each sending the same PUT again after any error or 5xx, while
    the appender's backend is terminated at random moments: every PUT ends in 201, or 200 when it
    was sent again after its stream was made, and every stream answered is there."""
    clients, per_client = 40, 25
    base = f"http://{open_durable_server}/pgstreams/v1/stream/faults-creates"
    retried: set[str] = set()

    async def create(client: httpx.AsyncClient, k: int) -> list[tuple[str, int]]:
        answers = []
        for i in range(per_client):
            path = f"{k}/{i}"
            put = partial(client.put, f"{base}/{path}", headers={"Content-Type": "text/plain"})
            status, tries = await until_answered(put)
            answers.append((path, status))
            if tries > 1:
                retried.add(path)
        return answers

    async def load() -> list[tuple[str, int]]:
        async with httpx.AsyncClient(timeout=30) as client:
            with AppenderKiller(seed=29) as killer:
                answers = await asyncio.gather(*(create(client, k) for k in range(clients)))
        print(
            f"{clients * per_client} creates over HTTP with {killer.kills} appender backend kills: "
            f"{len(retried)} sent again"
        )
        assert killer.kills >= 10
        return [answer for some in answers for answer in some]

    answers = asyncio.run(load())
    assert len(answers) == clients * per_client
    assert {status for _, status in answers} <= {200, 201}
    assert all(status == 201 for path, status in answers if path not in retried)
    made = set(Stream.objects.filter(path__startswith="faults-creates/").values_list("path", flat=True))
    assert made == {f"faults-creates/{path}" for path, _ in answers}


def test_a_signed_in_reader_and_writer_through_the_shortcut_recover_by_themselves_after_a_restart(
    open_durable_server: str,
) -> None:
    """A signed-in user's SSE read and Durable Streams write, through ``DurableStreamsFirst`` in a
    daphne process, while PostgreSQL stops and starts: both are answered again within
    QUERY_TIMEOUT of the start, and every request after that is. Before the fix the shortcut sent
    no request signals, so the dead connection its session lookups used was never closed: 500 on
    every signed-in request until the process restarted."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from pgstreams import conf

    server = ServerControl(connection.settings_dict)
    if server.why_not:
        pytest.skip(server.why_not)
    owner = get_user_model().objects.create_user("faults-restart")
    s = pgstreams.create_stream(owner=owner)
    pgstreams.write(s.id, "kept")
    pgstreams.close(s.id)
    client = Client()
    client.force_login(owner)
    cookie = f"sessionid={client.cookies['sessionid'].value}; csrftoken={'a' * 32}"
    base = f"http://{open_durable_server}/pgstreams"
    made = 0

    def read() -> int:
        answer = httpx.get(f"{base}/streams/{s.id}/events", headers={"Cookie": cookie}, timeout=30)
        return answer.status_code if answer.status_code != 200 or '"data":"kept"' in answer.text else 0

    def write() -> int:
        nonlocal made
        made += 1
        headers = {"Cookie": cookie, "X-CSRFToken": "a" * 32, "Content-Type": "text/plain"}
        return httpx.put(f"{base}/v1/stream/faults-restart/{made}", headers=headers, timeout=30).status_code

    assert (read(), write()) == (200, 201)
    server.stop()
    server.start()
    up_at = time.monotonic()
    _forget_dead_connections()
    failed: dict[str, list[int]] = {"read": [], "write": []}
    recovered: dict[str, float] = {}
    while len(recovered) < 2 and time.monotonic() < up_at + conf.query_timeout() + 10:  # bounded
        for name, send, ok in (("read", read, 200), ("write", write, 201)):
            if name not in recovered:
                status = send()
                if status == ok:
                    recovered[name] = time.monotonic() - up_at
                else:
                    failed[name].append(status)
        time.sleep(0.05)
    print(
        f"after the restart: the signed-in read answered again {recovered.get('read', -1):.2f} s after the start "
        f"({len(failed['read'])} answers {sorted(set(failed['read']))} before), the write "
        f"{recovered.get('write', -1):.2f} s ({len(failed['write'])} answers {sorted(set(failed['write']))} before); "
        f"QUERY_TIMEOUT {conf.query_timeout()} s (-1: not answered again)"
    )
    assert set(recovered) == {"read", "write"} and max(recovered.values()) <= conf.query_timeout()
    assert [read() for _ in range(5)] == [200] * 5 and [write() for _ in range(5)] == [201] * 5
