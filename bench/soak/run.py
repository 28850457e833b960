"""The soak's coordinator: a database of its own, the processes and proxies, the streams, the
faults, the settling, and the verdict.

Layout of a run (every process on this machine, on loopback):

- a database made for the run (``pgstreams_soak_<pid>``) on the server ``DATABASES['default']``
  names, dropped afterwards: pruning and restarts touch nothing of anyone else's;
- a freezing proxy in front of it, which the first writer and reader processes' own pgstreams
  connections (appender, flusher, listener, fetcher) go through; a hot standby of the server,
  which the second reader process reads from (where this machine has the binaries for one);
- two daphne processes of the demo project (Durable Streams endpoint open), each behind a
  proxy that can cut its clients' sockets; the client process connects only through those;
- ``WRITERS`` writer, ``READERS`` reader and one client process; a killed one is started again
  (its next incarnation), a crashed one too, and the crash is an anomaly.

The coordinator keeps ``STREAMS`` streams open, each for a few seconds to half a minute, then
closes it (now and then with a last append over HTTP). After the faults come the settling:
writers stop, every stream is closed, readers must end their sessions within ``SETTLE`` seconds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from bench import pgserver
from bench.proxy import FreezingProxy, database_via, proxy_for
from pgstreams.durable import wire

from . import check, faults
from .faults import NotInjected
from .record import CONTENT_TYPE, LABEL, PHASE_FILE, Log

ROOT = Path(__file__).resolve().parent.parent.parent
WRITERS, READERS, CLIENTS, DAPHNES = 2, 2, 1, 2
STREAMS = 12
LIFETIME = (4.0, 30.0)  # seconds a stream stays open
FAULT_EVERY = 2.2  # seconds between faults, on average
SETTLE = 120.0
QUERY_TIMEOUT = 2.0
FROZEN_FOR = 3 * QUERY_TIMEOUT  # a frozen connection is dropped after this (its client gave up on it)
PRUNE_MARGIN = "5 seconds"  # only streams closed longer ago are pruned: none is still being closed
# The settings of every soak process: failures noticed within seconds, polls often.
PGSTREAMS = {"QUERY_TIMEOUT": QUERY_TIMEOUT, "LISTEN_CHECK_INTERVAL": 2.0, "POLL_INTERVAL": 0.5, "CONNECT_TIMEOUT": 2}


@dataclass
class SoakConfig:
    minutes: float
    seed: int
    keep: bool = False
    fault_every: float = FAULT_EVERY
    kinds: list[str] | None = None  # None: every kind this machine can inject


@dataclass
class Outcome:
    verdict: check.Verdict
    tally: faults.Tally
    crashes: list[str]
    stuck: list[str]
    run_dir: Path
    seconds: float
    kinds_unavailable: dict[str, str] = field(default_factory=dict)

    @property
    def anomalies(self) -> int:
        return sum(self.verdict.anomalies.values()) + len(self.crashes) + len(self.stuck)


class Slot:
    """A worker or server process and its incarnations."""

    def __init__(self, role: str, index: int, command: Callable[[int], list[str]], env: dict[str, str], logs: Path):
        self.role, self.index, self.command, self.env, self.logs = role, index, command, env, logs
        self.incarnation = -1
        self.proc: subprocess.Popen[bytes] | None = None
        self.restart_at: float | None = None  # when a killed process starts again
        self.finished = False
        self.lock = threading.Lock()

    @property
    def name(self) -> str:
        return f"{self.role}{self.index}"

    def start(self) -> None:
        self.incarnation += 1
        err = open(self.logs / f"{self.name}-{self.incarnation}.err", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(self.command(self.incarnation), cwd=ROOT, env=self.env, stdout=err, stderr=err)
        err.close()
        self.restart_at = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, restart_in: float) -> None:
        with self.lock:
            if self.alive():
                self.restart_at = time.monotonic() + restart_in
                self.proc.kill()

    def stderr_tail(self) -> str:
        path = self.logs / f"{self.name}-{self.incarnation}.err"
        return path.read_text(errors="replace")[-1500:] if path.exists() else ""


class Soak:
    """One run (see the module docstring); ``run()`` returns its outcome."""

    def __init__(self, config: SoakConfig, say: Callable[[str], None]) -> None:
        self.config, self.say = config, say
        self.run_dir = Path(tempfile.mkdtemp(prefix=f"pgstreams-soak-{config.seed}-"))
        (self.run_dir / "proc").mkdir()
        self.log = Log(self.run_dir, "coordinator")
        self.rng = random.Random(f"{config.seed}/coordinator")
        self.slots: list[Slot] = []
        self.crashes: list[str] = []
        self.stop = threading.Event()
        self.server_lock = threading.Lock()  # a restart excludes the faults that query the server
        self.open: dict[str, tuple[uuid.UUID, float]] = {}  # path -> (id, when to close it)
        self.created = 0
        self.closes = 0
        self.standby: pgserver.Standby | None = None
        self.client_proxies: list[FreezingProxy] = []

    # -- the database --------------------------------------------------------------------------

    def _make_database(self) -> None:
        from django.conf import settings
        from django.core.management import call_command
        from django.db import connections

        base = connections["default"]
        base.ensure_connection()  # the embedded backend fills HOST and PORT in when it connects
        self.name = f"pgstreams_soak_{os.getpid()}"
        with pgserver.connect(base.settings_dict) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
        self.entry = {**base.settings_dict, "ENGINE": "django.db.backends.postgresql", "NAME": self.name}
        configured = connections.configure_settings({**settings.DATABASES, "soak": self.entry})
        settings.DATABASES["soak"] = connections.settings["soak"] = configured["soak"]
        call_command("migrate", database="soak", verbosity=0)

    def _drop_database(self) -> None:
        from django.db import connections

        connections["soak"].close()
        with pgserver.connect(connections["default"].settings_dict) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name)))

    def db(self) -> psycopg.Connection[Any]:
        return pgserver.connect(self.entry, connect_timeout=3)

    @staticmethod
    def url(entry: dict[str, Any]) -> str:
        return make_conninfo(
            dbname=entry["NAME"],
            user=entry.get("USER") or None,
            password=entry.get("PASSWORD") or None,
            host=entry.get("HOST") or None,
            port=str(entry.get("PORT") or "") or None,
        )

    # -- processes -----------------------------------------------------------------------------

    def _slots(self, db_proxy: FreezingProxy) -> None:
        via = self.url(database_via(db_proxy, self.entry))
        base_env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "bench.soak.settings",
            "DATABASE_URL": self.url(self.entry),
            "DEMO_OPEN_DURABLE_STREAMS": "1",
            "PYTHONUNBUFFERED": "1",
        }

        def env(pgstreams: dict[str, Any], databases: dict[str, str]) -> dict[str, str]:
            return {
                **base_env,
                "SOAK_PGSTREAMS": json.dumps({**PGSTREAMS, **pgstreams}),
                "SOAK_DATABASES": json.dumps(databases),
            }

        proxied = env({"DATABASE": "via"}, {"via": via})
        plain = env({}, {})
        logs = self.run_dir / "proc"
        for i in range(DAPHNES):
            port = self.daphne_ports[i]
            command = [sys.executable, "-m", "daphne", "-v", "0", "-b", "127.0.0.1", "-p", str(port)]
            self.slots.append(
                Slot("daphne", i, lambda _, c=command: [*c, "demo_project.asgi:application"], plain, logs)
            )

        def worker(module: str, index: int) -> Callable[[int], list[str]]:
            return lambda inc: [
                sys.executable,
                *("-m", "bench.soak.worker", module, str(index), str(inc), str(self.run_dir), str(self.config.seed)),
            ]

        for i in range(WRITERS):
            self.slots.append(Slot("writer", i, worker("writers", i), proxied if i == 0 else plain, logs))
        for i in range(READERS):
            if i == 0:
                reader_env = proxied
            elif self.standby is not None:
                reader_env = env({"READ_DATABASE": "standby"}, {"standby": self.url(self.standby.database())})
            else:
                reader_env = plain
            self.slots.append(Slot("reader", i, worker("readers", i), reader_env, logs))
        for i in range(CLIENTS):
            self.slots.append(Slot("clients", i, worker("clients", i), plain, logs))

    def _supervise(self) -> None:
        """Start again what was killed, once its moment comes; note and restart what crashed."""
        while not self.stop.wait(0.1):
            for slot in self.slots:
                with slot.lock:
                    if slot.finished or slot.alive() or slot.proc is None:
                        continue
                    if slot.restart_at is None:  # it left by itself
                        code = slot.proc.returncode
                        if code == 0 and self.settling and slot.role != "daphne":
                            slot.finished = True
                            continue
                        self.crashes.append(f"{slot.name}-{slot.incarnation} exited {code}: {slot.stderr_tail()}")
                        slot.restart_at = time.monotonic() + 1.0
                    if time.monotonic() >= slot.restart_at:
                        slot.start()

    # -- streams ---------------------------------------------------------------------------------

    def _streams(self) -> None:
        """Keep STREAMS streams open; close each when its time comes."""
        from django.db import Error, connections

        import pgstreams

        while not self.stop.is_set():
            try:
                while len(self.open) < STREAMS and not self.settling:
                    path = f"soak/{self.created}"
                    stream = pgstreams.create_stream(label=LABEL, path=path, content_type=CONTENT_TYPE, using="soak")
                    self.created += 1
                    self.log(e="created", s=path, id=str(stream.id))
                    self.open[path] = (stream.id, time.monotonic() + self.rng.uniform(*LIFETIME))
                for path, (sid, until) in list(self.open.items()):
                    if time.monotonic() >= until or self.settling:
                        self._close(path, sid)
                        del self.open[path]
            except Error:
                connections.close_all()
            self.stop.wait(0.1)
        connections.close_all()

    def _close(self, path: str, sid: uuid.UUID) -> None:
        """Close a stream: mostly from Python; now and then over HTTP, with a last append."""
        import pgstreams

        if self.rng.random() < 0.2 and not self.settling:
            self.closes += 1
            data = json.dumps(f"coordinator.c{self.closes}")
            self.log(e="try", k="http-close", s=path, d=[data])
            host = self.rng.choice(self.hosts)
            headers = {"Content-Type": CONTENT_TYPE, "Stream-Closed": "true"}
            try:
                response = httpx.post(f"http://{host}/pgstreams/v1/stream/{path}", content=data, headers=headers)
            except httpx.HTTPError as exc:
                self.log(e="err", k="http-close", s=path, d=[data], why=str(exc), absent=False)
            else:
                if response.status_code in (200, 204):
                    offset = wire.parse_offset(response.headers["Stream-Next-Offset"]) - 1
                    self.log(e="ok", k="http-close", s=path, d=[data], o=[offset])
                    return
                refused = response.status_code < 500  # a 5xx may come after the commit
                self.log(e="err", k="http-close", s=path, d=[data], why=response.text[:200], absent=refused)
        with contextlib.suppress(pgstreams.StreamClosed):
            pgstreams.close(sid, using="soak")

    def _close_everything(self) -> None:
        """Close every stream still open (the settling), whatever faults left behind."""
        import pgstreams

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with self.db() as conn:
                    ids = [
                        r[0]
                        for r in conn.execute(
                            "SELECT id FROM pgstreams_stream WHERE label = %s AND closed_at IS NULL", [LABEL]
                        )
                    ]
                for sid in ids:
                    with contextlib.suppress(pgstreams.StreamClosed, pgstreams.StreamNotFound):
                        pgstreams.close(sid, using="soak")
                if not ids:
                    return
            except (psycopg.Error, Exception) as exc:  # noqa: B014 (Django's errors too)
                self.say(f"soak: closing the streams failed, again: {exc}")
                from django.db import connections

                connections.close_all()
            time.sleep(0.5)

    # -- faults (faults.Target) ------------------------------------------------------------------

    def available(self, kind: str) -> str:
        """Why this machine cannot inject ``kind`` ("" if it can)."""
        if kind == "restart-server":
            return self.server.why_not
        if kind == "pause-standby":
            return self.standby_why_not
        return ""

    def kill(self, roles: tuple[str, ...], rng: random.Random) -> str:
        alive = [s for s in self.slots if s.role in roles and s.alive() and not s.finished]
        if not alive:
            raise NotInjected("no such process alive")
        slot = rng.choice(alive)
        slot.kill(restart_in=rng.uniform(0.2, 1.5))
        return f"SIGKILL {slot.name}-{slot.incarnation}"

    def terminate_backend(self, role: str, rng: random.Random) -> str:
        with self.server_lock, self.db() as conn:
            found = conn.execute(
                "SELECT pid, application_name FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name LIKE %s",
                [f"pgstreams {role} %"],
            ).fetchall()
            if not found:
                raise NotInjected(f"no {role} connection")
            pid, name = rng.choice(found)
            conn.execute("SELECT pg_terminate_backend(%s)", [pid])
        return f"terminated {name}"

    def freeze(self) -> str:
        frozen = self.db_proxy.freeze()
        if not frozen:
            raise NotInjected("no connection through the proxy")
        return f"froze {frozen} connection(s)"

    def restart_server(self, rng: random.Random) -> str:
        if self.server.why_not:
            raise NotInjected(self.server.why_not)
        down = rng.uniform(0.1, 1.0)
        with self.server_lock:
            self.server.stop()
            time.sleep(down)
            self.server.start()
        return f"down {down:.2f} s"

    def prune(self, rng: random.Random) -> str:
        """Copy the streams closed a while ago into the record, then prune them."""
        from django.db import connections

        from pgstreams import maintenance

        with self.server_lock, self.db() as conn:
            cutoff = conn.execute(f"SELECT now() - interval '{PRUNE_MARGIN}'").fetchone()[0]
            doomed = conn.execute(
                "SELECT id, path FROM pgstreams_stream WHERE label = %s AND closed_at < %s AND deleted_at IS NULL",
                [LABEL, cutoff],
            ).fetchall()
            if not doomed:
                raise NotInjected("no stream closed long enough ago")
            for sid, path in doomed:
                rows = conn.execute(
                    'SELECT "offset", data FROM pgstreams_chunk WHERE stream_id = %s ORDER BY "offset"', [sid]
                ).fetchall()
                self.log(e="pruning", s=path, chunks=rows)
        batch = rng.choice((25, 200, 10_000))
        try:
            done = maintenance.prune(cutoff, batch=batch, using="soak")
        finally:
            connections.close_all()
        if done.streams != len(doomed):
            self.log(e="prune-race", copied=len(doomed), pruned=done.streams)
        return f"{done.streams} stream(s), {done.chunks} chunk(s), batch {batch}"

    def cut_clients(self, rng: random.Random) -> str:
        cut = rng.choice(self.client_proxies).cut()
        if not cut:
            raise NotInjected("no client connection")
        return f"cut {cut} client connection(s)"

    def pause_standby(self, rng: random.Random) -> str:
        if self.standby is None:
            raise NotInjected(self.standby_why_not)
        seconds = rng.uniform(0.3, 3.0)
        with self.server_lock, self.standby.replay_paused():
            time.sleep(seconds)
        return f"replay paused {seconds:.2f} s"

    # -- the run -------------------------------------------------------------------------------

    @property
    def settling(self) -> bool:
        return (self.run_dir / PHASE_FILE).read_text().strip() == "settle"

    def run(self) -> Outcome:
        from django.test import override_settings

        began = time.monotonic()
        self._make_database()
        (self.run_dir / PHASE_FILE).write_text("run")
        overrides = override_settings(PGSTREAMS={"DATABASE": "soak", **PGSTREAMS})
        overrides.enable()
        quiet = logging.getLogger("pgstreams")  # its warnings of every reconnect are the faults at work
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            return self._run(began)
        finally:
            quiet.setLevel(level)
            overrides.disable()
            self._teardown()

    def _run(self, began: float) -> Outcome:
        self.server = pgserver.ServerControl(self.entry)
        standby = pgserver.Standby(self.entry)
        self.standby_why_not = standby.why_not
        if not standby.why_not:
            self.standby = standby.__enter__()
        self.db_proxy = proxy_for(self.entry, max_connections=None).start()
        self.daphne_ports = [_free_port() for _ in range(DAPHNES)]
        self.client_proxies = [
            FreezingProxy(("127.0.0.1", port), max_connections=None).start() for port in self.daphne_ports
        ]
        self.hosts = [f"127.0.0.1:{p.port}" for p in self.client_proxies]
        (self.run_dir / "config.json").write_text(json.dumps({"hosts": self.hosts, "seed": self.config.seed}))
        self._slots(self.db_proxy)
        for slot in self.slots:
            slot.start()
        self._wait_for_daphne()
        helpers = [
            threading.Thread(target=self._supervise, name="soak-supervisor", daemon=True),
            threading.Thread(target=self._streams, name="soak-streams", daemon=True),
            threading.Thread(target=self._janitor, name="soak-janitor", daemon=True),
        ]
        for thread in helpers:
            thread.start()

        kinds = self.config.kinds or list(faults.KINDS)
        unavailable = {k: why for k in kinds if (why := self.available(k))}
        seconds = self.config.minutes * 60
        schedule = faults.schedule(
            self.config.seed, seconds, self.config.fault_every, [k for k in kinds if k not in unavailable]
        )
        injector = faults.Injector(self, schedule, self.say, self.log)
        self.say(
            f"soak: seed {self.config.seed}, {self.config.minutes:g} min, {len(schedule)} faults scheduled; "
            f"record in {self.run_dir}"
        )
        for kind, why in unavailable.items():
            self.say(f"soak: no {kind} faults here: {why}")
        started = time.monotonic()
        self._progress(injector, started, seconds)
        injector.stop()
        self.db_proxy.drop_frozen(0)

        self.say("soak: settling: writers stop, every stream is closed, readers finish")
        (self.run_dir / PHASE_FILE).write_text("settle")
        self._wait(lambda: self._writers_done(), 90, "writers to stop")
        self._close_everything()
        stuck = self._wait(lambda: all(s.finished for s in self.slots if s.role != "daphne"), SETTLE, "readers")
        stuck_names = (
            [
                f"{s.name}-{s.incarnation}: {s.stderr_tail()[-300:]}"
                for s in self.slots
                if s.role != "daphne" and not s.finished
            ]
            if stuck
            else []
        )
        self.stop.set()
        for thread in helpers:
            thread.join(10)
        self._stop_processes()

        self.say("soak: checking every stream against the table")
        truth = self._truth()
        verdict = check.check(self.run_dir, truth)
        return Outcome(
            verdict, injector.tally, self.crashes, stuck_names, self.run_dir, time.monotonic() - began, unavailable
        )

    def _progress(self, injector: faults.Injector, started: float, seconds: float) -> None:
        thread = threading.Thread(target=injector.run, args=(started,), name="soak-faults", daemon=True)
        thread.start()
        next_report = started + 30
        while (left := started + seconds - time.monotonic()) > 0:
            time.sleep(min(left, 1.0))
            if time.monotonic() >= next_report:
                next_report += 30
                done = sum(injector.tally.injected.values())
                self.say(f"soak: {time.monotonic() - started:.0f} s, {done} faults, {self.created} streams")

    def _writers_done(self) -> bool:
        writers = all(s.finished for s in self.slots if s.role == "writer")
        clients = all(
            len(list(self.run_dir.glob(f"writers-done.clients{s.index}-{s.incarnation}.*"))) == 4
            for s in self.slots
            if s.role == "clients" and not s.finished
        )
        return writers and clients

    def _wait(self, done: Callable[[], bool], seconds: float, what: str) -> bool:
        """Wait for ``done()``; True (and a message) if it is still false after ``seconds``."""
        deadline = time.monotonic() + seconds
        while not done():
            if time.monotonic() > deadline:
                self.say(f"soak: still waiting for {what} after {seconds:.0f} s")
                return True
            time.sleep(0.2)
        return False

    def _janitor(self) -> None:
        while not self.stop.wait(1.0):
            self.db_proxy.drop_frozen(FROZEN_FOR)

    def _wait_for_daphne(self) -> None:
        deadline = time.monotonic() + 60
        for port in self.daphne_ports:
            while True:
                try:
                    httpx.get(f"http://127.0.0.1:{port}/pgstreams/v1/stream/-", timeout=2)
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the soak's daphne servers did not start") from None
                    time.sleep(0.2)

    def _stop_processes(self) -> None:
        for slot in self.slots:
            if slot.alive():
                slot.proc.send_signal(signal.SIGTERM)
        for slot in self.slots:
            if slot.proc is not None:
                try:
                    slot.proc.wait(10)
                except subprocess.TimeoutExpired:
                    slot.proc.kill()
                    slot.proc.wait(10)

    def _truth(self) -> check.Truth:
        chunks: dict[str, dict[int, str]] = {}
        pruned: set[str] = set()
        created: set[str] = set()
        for line in (self.run_dir / "log" / "coordinator.jsonl").read_text().splitlines():
            event = json.loads(line)
            if event["e"] == "pruning":
                pruned.add(event["s"])
                chunks[event["s"]] = {o: d for o, d in event["chunks"]}
            elif event["e"] == "created":
                created.add(event["s"])
        next_offsets: dict[str, int] = {}
        with self.db() as conn:
            for path, next_offset in conn.execute(
                "SELECT path, next_offset FROM pgstreams_stream WHERE label = %s", [LABEL]
            ):
                next_offsets[path] = next_offset
                chunks.setdefault(path, {})
            with conn.transaction(), conn.cursor(name="truth") as cursor:
                cursor.execute(
                    'SELECT s.path, c."offset", c.data FROM pgstreams_chunk AS c'
                    " JOIN pgstreams_stream AS s ON s.id = c.stream_id WHERE s.label = %s",
                    [LABEL],
                )
                for path, offset, data in cursor:
                    chunks[path][offset] = data
        return check.Truth(chunks, next_offsets, pruned, created)

    def _teardown(self) -> None:
        self.stop.set()
        with contextlib.suppress(Exception):
            self._stop_processes()
        for proxy in [*self.client_proxies, *([self.db_proxy] if hasattr(self, "db_proxy") else [])]:
            proxy.close()
        if self.standby is not None:
            self.standby.stop()
        from pgstreams import appender, notify

        appender.stop_appenders()
        notify.stop_flusher()
        if not self.config.keep:
            with contextlib.suppress(Exception):
                self._drop_database()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def report(outcome: Outcome, seed: int, say: Callable[[str], None]) -> None:
    """Print the outcome: faults by kind, what was written and read, anomalies, one summary line."""
    tally, verdict = outcome.tally, outcome.verdict
    say("soak: faults survived: " + ", ".join(f"{k} {n}" for k, n in sorted(tally.injected.items())))
    if tally.skipped:
        say(
            "soak: faults that found nothing to act on: "
            + ", ".join(f"{k} {n}" for k, n in sorted(tally.skipped.items()))
        )
    for failure in tally.failed[:10]:
        say(f"soak: a fault could not be injected: {failure}")
    say("soak: writes: " + ", ".join(f"{k} {n}" for k, n in sorted(verdict.attempts.items())))
    say("soak: reader sessions: " + ", ".join(f"{k} {n}" for k, n in sorted(verdict.sessions.items())))
    for kind, count in sorted(verdict.anomalies.items()):
        say(f"soak: ANOMALY {kind}: {count}")
        for example in verdict.examples[kind]:
            say(f"soak:   {example}")
    for crash in outcome.crashes:
        say(f"soak: ANOMALY crash: {crash}")
    for stuck in outcome.stuck:
        say(f"soak: ANOMALY stuck: {stuck}")
    injected = sum(tally.injected.values())
    checked = verdict.written + verdict.delivered
    say(
        f"soak: {injected} faults ({len(tally.injected)} kinds), {checked} chunks checked "
        f"({verdict.written} written, {verdict.delivered} delivered), {outcome.anomalies} anomalies, seed {seed}"
    )


def soak(config: SoakConfig, say: Callable[[str], None] = print) -> Outcome:
    outcome = Soak(config, say).run()
    report(outcome, config.seed, say)
    if outcome.anomalies == 0 and not config.keep:
        shutil.rmtree(outcome.run_dir, ignore_errors=True)
    else:
        say(f"soak: the record is kept in {outcome.run_dir}")
    return outcome
