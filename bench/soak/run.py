"""The soak's coordinator: a database of its own, the streams, the schedule of faults, the
settling, and the verdict.

A run makes servers of its own (``servers``: a primary and a hot standby, PostgreSQL 18 from the
embedded binaries, whatever ``DATABASES`` names) and a database on them, removed afterwards:
restarts, switchovers and pruning touch nothing of anyone else's. In front of the primary, a
freezing proxy, and a PgBouncer (transaction pooling) where this machine has Debian's, which one
daphne goes through; in front of each daphne process, a proxy that can cut its clients' sockets
(the client process connects only through those). The processes are ``processes``'s; the faults
``faults``'s.

The coordinator keeps ``STREAMS`` streams open, each for a few seconds to half a minute, then
closes it (now and then with a last append over HTTP). After the faults comes the settling:
writers stop, every stream is closed, readers must end their sessions within ``SETTLE`` seconds.
Then every stream is checked against the table (``check``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import shutil
import signal
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from psycopg import sql

from bench import pgserver, scratch
from bench.pgbouncer import PgBouncer, pgbouncer_missing
from bench.proxy import FreezingProxy, database_via
from pgstreams.durable import wire

from . import check, faults, processes
from .clients import PLAIN_WRITERS, PRODUCER_WRITERS
from .record import CONTENT_TYPE, GENERATION_LABEL, LABEL, PHASE_FILE, Log
from .servers import ServerPair

STREAMS = 12
LIFETIME = (4.0, 30.0)  # seconds a stream stays open
FAULT_EVERY = 2.2  # seconds between faults, on average
SETTLE = 120.0


@dataclass
class SoakConfig:
    minutes: float
    seed: int
    keep: bool = False
    fault_every: float = FAULT_EVERY
    kinds: list[str] | None = None  # None: every kind this machine can inject
    notify_shards: int | None = None  # None: one of SHARDS, drawn from the seed


# NOTIFY_SHARDS of a run, the same in all its processes: one channel, or a changing set of them
# that each listener LISTENs to as it follows streams, across its reconnects.
SHARDS = (1, 1024)


@dataclass
class Outcome:
    verdict: check.Verdict
    tally: faults.Tally
    crashes: list[str]
    lost_database: list[str]
    stuck: list[str]
    run_dir: Path
    seconds: float
    kinds_unavailable: dict[str, str] = field(default_factory=dict)
    notify_shards: int = 1

    @property
    def anomalies(self) -> int:
        return sum(self.verdict.anomalies.values()) + len(self.crashes) + len(self.stuck)


class Soak:
    """One run (see the module docstring); ``run()`` returns its outcome."""

    def __init__(self, config: SoakConfig, say: Callable[[str], None]) -> None:
        self.config, self.say = config, say
        self.run_dir = Path(tempfile.mkdtemp(prefix=f"pgstreams-soak-{config.seed}-"))
        (self.run_dir / "proc").mkdir()
        self.log = Log(self.run_dir, "coordinator")
        self.rng = random.Random(f"{config.seed}/coordinator")
        self.shards = config.notify_shards or random.Random(f"{config.seed}/shards").choice(SHARDS)
        self.stop = threading.Event()
        self.open: dict[str, tuple[uuid.UUID, float]] = {}  # path -> (id, when to close it)
        self.created = self.closes = 0
        self.name = f"pgstreams_soak_{config.seed}"
        self.servers: ServerPair | None = None
        self.bouncer: PgBouncer | None = None
        self.proxies: list[FreezingProxy] = []
        self.processes: processes.Processes | None = None

    @property
    def settling(self) -> bool:
        return (self.run_dir / PHASE_FILE).read_text().strip() == "settle"

    # -- the database --------------------------------------------------------------------------

    def _make_database(self) -> None:
        """The servers, the database on them, and the alias ``soak`` for it, migrated."""
        from django.conf import settings
        from django.db import connections

        self.servers = ServerPair()
        self.servers.start()
        with self.servers.connect_primary() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
        self.entry = self.servers.database(self.name)
        configured = connections.configure_settings({**settings.DATABASES, "soak": self.entry})
        settings.DATABASES["soak"] = connections.settings["soak"] = configured["soak"]
        scratch.migrate_database("soak")

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
        from django.db import connections

        import pgstreams

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with pgserver.connect(self.entry, connect_timeout=3) as conn:
                    query = "SELECT id FROM pgstreams_stream WHERE label = %s AND closed_at IS NULL"
                    ids = [row[0] for row in conn.execute(query, [LABEL])]
                for sid in ids:
                    with contextlib.suppress(pgstreams.StreamClosed, pgstreams.StreamNotFound):
                        pgstreams.close(sid, using="soak")
                if not ids:
                    return
            except Exception as exc:  # psycopg's and Django's errors alike: the server is back soon
                self.say(f"soak: closing the streams failed, again: {exc}")
                connections.close_all()
            time.sleep(0.5)

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> Outcome:
        from django.test import override_settings

        began = time.monotonic()
        self._make_database()
        (self.run_dir / PHASE_FILE).write_text("run")
        overrides = override_settings(
            PGSTREAMS={"DATABASE": "soak", **processes.PGSTREAMS, "NOTIFY_SHARDS": self.shards}
        )
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
        assert self.servers is not None
        db_proxy = FreezingProxy(self.servers.primary_socket(), max_connections=None).start()
        ports = [_free_port() for _ in range(processes.DAPHNES)]
        clients = [FreezingProxy(("127.0.0.1", port), max_connections=None).start() for port in ports]
        self.proxies = [db_proxy, *clients]
        self.hosts = [f"127.0.0.1:{p.port}" for p in clients]
        (self.run_dir / "config.json").write_text(json.dumps({"hosts": self.hosts, "seed": self.config.seed}))
        no_bouncer = pgbouncer_missing() or ""
        if not no_bouncer:
            self.bouncer = PgBouncer(self.servers.primary_database(self.name), pool_size=4)
            self.bouncer.start()
        slots = processes.layout(
            self.run_dir,
            self.config.seed,
            self.entry,
            database_via(db_proxy, self.entry),
            self.servers.standby_database(self.name),
            self.bouncer.entry if self.bouncer is not None else None,
            self.shards,
            ports,
        )
        self.processes = processes.Processes(slots, lambda: self.settling)
        self.processes.start()
        _wait_for(ports)
        streams = threading.Thread(target=self._streams, name="soak-streams", daemon=True)
        streams.start()

        injections = faults.Injections(
            self.processes,
            self.entry,
            self.servers,
            db_proxy,
            clients,
            self.bouncer,
            no_bouncer,
            self.log,
        )
        kinds = self.config.kinds or list(faults.KINDS)
        unavailable = {k: why for k in kinds if (why := injections.unavailable(k))}
        seconds = self.config.minutes * 60
        # Drawn from every kind asked for, so that a seed schedules the same faults on any machine;
        # one this machine cannot inject finds nothing to act on when its moment comes.
        injector = faults.Injector(
            injections, faults.schedule(self.config.seed, seconds, self.config.fault_every, kinds), self.log
        )
        self.say(
            f"soak: seed {self.config.seed}, {self.config.minutes:g} min, {len(injector.faults)} faults scheduled, "
            f"NOTIFY_SHARDS {self.shards}; record in {self.run_dir}"
        )
        for kind, why in unavailable.items():
            self.say(f"soak: no {kind} faults here: {why}")
        if why := processes.no_aisdk_reader():
            self.say(f"soak: no AI SDK reader here: {why}")
        self._inject(injector, seconds)

        self.say("soak: settling: writers stop, every stream is closed, readers finish")
        (self.run_dir / PHASE_FILE).write_text("settle")
        self._wait(self._writers_done, 90, "writers to stop")
        self._close_everything()
        self._wait(self._generations_done, SETTLE, "the generations to end")
        workers = self.processes.of("writer", "reader", "clients", "aisdk")
        self._wait(lambda: all(s.finished for s in workers), SETTLE, "readers")
        stuck = [f"{s.name}-{s.incarnation}: {s.stderr_tail(300)}" for s in workers if not s.finished]
        if stuck:  # where the servers are, for whoever reads the record
            for slot in self.processes.of("daphne"):
                if slot.alive():
                    slot.proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
            self.say("soak: the daphne processes' stacks, as readers were stuck, are in proc/daphne*.err")
        self.stop.set()
        streams.join(10)
        self.processes.stop()

        self.say("soak: checking every stream against the table")
        verdict = check.check(self.run_dir, self._truth())
        elapsed = time.monotonic() - began
        return Outcome(
            verdict,
            injector.tally,
            self.processes.crashes,
            self.processes.lost_database,
            stuck,
            self.run_dir,
            elapsed,
            unavailable,
            self.shards,
        )

    def _inject(self, injector: faults.Injector, seconds: float) -> None:
        """Run the schedule for ``seconds``, reporting every 30 s; then wait for the faults to end."""
        started = time.monotonic()
        thread = threading.Thread(target=injector.run, args=(started,), name="soak-faults", daemon=True)
        thread.start()
        next_report = started + 30
        while (left := started + seconds - time.monotonic()) > 0:
            time.sleep(min(left, 1.0))
            if time.monotonic() >= next_report:
                next_report += 30
                done = sum(injector.tally.injected.values())
                self.say(f"soak: {time.monotonic() - started:.0f} s, {done} faults, {self.created} streams")
        injector.stop()

    def _writers_done(self) -> bool:
        """The writer processes have finished, and each client process's writers have stopped."""
        assert self.processes is not None
        writers = all(s.finished for s in self.processes.of("writer"))
        http = PLAIN_WRITERS + PRODUCER_WRITERS
        clients = all(
            len(list(self.run_dir.glob(f"writers-done.clients{s.index}-{s.incarnation}.*"))) == http
            for s in self.processes.of("clients")
            if not s.finished
        )
        return writers and clients

    def _generations_done(self) -> bool:
        """No generation is open (the task workers end every one, whatever faults left behind)."""
        try:
            with pgserver.connect(self.entry, connect_timeout=3) as conn:
                query = "SELECT count(*) FROM pgstreams_stream WHERE label = %s AND closed_at IS NULL"
                return conn.execute(query, [GENERATION_LABEL]).fetchone()[0] == 0
        except Exception:  # psycopg's errors: the server is back soon
            return False

    def _wait(self, done: Callable[[], bool], seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while not done():
            if time.monotonic() > deadline:
                self.say(f"soak: still waiting for {what} after {seconds:.0f} s")
                return
            time.sleep(0.2)

    def _truth(self) -> check.Truth:
        """Every chunk of the soak's streams: the table's, and the copies of those pruned."""
        truth = check.copied(self.run_dir)
        chunks = truth.chunks
        generations: dict[str, check.Answer] = {}  # the table's
        with pgserver.connect(self.entry, connect_timeout=10) as conn:
            query = "SELECT path, next_offset FROM pgstreams_stream WHERE label = %s"
            for path, next_offset in conn.execute(query, [LABEL]):
                truth.next_offsets[path] = next_offset
                chunks.setdefault(path, {})
            with conn.transaction(), conn.cursor(name="truth") as cursor:
                cursor.execute(
                    'SELECT s.path, c."offset", c.data FROM pgstreams_chunk AS c'
                    " JOIN pgstreams_stream AS s ON s.id = c.stream_id WHERE s.label = %s",
                    [LABEL],
                )
                for path, offset, data in cursor:
                    chunks[path][offset] = data
            query = (
                "SELECT path, closed_at IS NOT NULL, (metadata->'pgstreams_generation'->>'attempt')::int"
                " FROM pgstreams_stream WHERE label = %s"
            )
            for path, closed, attempts in conn.execute(query, [GENERATION_LABEL]):
                generations[path] = check.Answer(closed, attempts, [])
            query = (
                "SELECT s.path, c.data FROM pgstreams_chunk AS c JOIN pgstreams_stream AS s ON s.id = c.stream_id"
                ' WHERE s.label = %s ORDER BY s.path, c."offset"'
            )
            for path, data in conn.execute(query, [GENERATION_LABEL]):
                generations[path].chunks.append(data)
        for path, answer in generations.items():  # what a prune cut short left: its copy is whole
            truth.generations.setdefault(path, answer)
        return truth

    def _teardown(self) -> None:
        self.stop.set()
        if self.processes is not None:
            with contextlib.suppress(Exception):
                self.processes.stop()
        for proxy in self.proxies:
            proxy.close()
        if self.bouncer is not None:
            self.bouncer.close()
        from pgstreams import appender, notify

        appender.stop_appenders()
        notify.stop_flusher()
        from django.db import connections

        if "soak" in connections:
            connections["soak"].close()
            del connections["soak"]  # the next run's "soak" is on other servers
        if self.servers is not None:
            self.servers.close(keep=self.config.keep)
            if self.config.keep:
                self.say(f"soak: the servers are kept, stopped, in {self.servers.root}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(ports: list[int]) -> None:
    """Until the daphne servers on ``ports`` answer (at most a minute)."""
    deadline = time.monotonic() + 60
    for port in ports:
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/pgstreams/v1/stream/-", timeout=2)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the soak's daphne servers did not start") from None
                time.sleep(0.2)


def report(outcome: Outcome, seed: int, say: Callable[[str], None]) -> None:
    """Print the outcome: faults by kind, what was written and read, anomalies, one summary line."""
    tally, verdict = outcome.tally, outcome.verdict

    def counts(counter: Any) -> str:
        return ", ".join(f"{k} {n}" for k, n in sorted(counter.items()))

    say(f"soak: faults survived: {counts(tally.injected)}")
    if tally.skipped:
        say(f"soak: faults that found nothing to act on: {counts(tally.skipped)}")
    for failure in tally.failed[:10]:
        say(f"soak: a fault could not be injected: {failure}")
    say(f"soak: writes: {counts(verdict.attempts)}")
    say(f"soak: reader sessions: {counts(verdict.sessions)}")
    say(f"soak: generations: {verdict.generations} answers checked, taken over {verdict.takeovers} times")
    for kind, count in sorted(verdict.anomalies.items()):
        say(f"soak: ANOMALY {kind}: {count}")
        for example in verdict.examples[kind]:
            say(f"soak:   {example}")
    if outcome.lost_database:
        say(f"soak: task workers that exited as their database went away, started again: {len(outcome.lost_database)}")
    for crash in outcome.crashes:
        say(f"soak: ANOMALY crash: {crash}")
    for stuck in outcome.stuck:
        say(f"soak: ANOMALY stuck: {stuck}")
    injected = sum(tally.injected.values())
    checked = verdict.written + verdict.delivered
    say(
        f"soak: {injected} faults ({len(tally.injected)} kinds), {checked} chunks checked "
        f"({verdict.written} written, {verdict.delivered} delivered), {outcome.anomalies} anomalies, "
        f"seed {seed} ({outcome.seconds:.0f} s in all)"
    )


def summary(outcome: Outcome, config: SoakConfig) -> dict[str, Any]:
    """A run's figures, for the results page's report (``pgstreams_soak --json``)."""
    verdict, tally = outcome.verdict, outcome.tally
    anomalies = dict(verdict.anomalies)
    if outcome.crashes or outcome.stuck:
        anomalies.update({"crash": len(outcome.crashes), "stuck": len(outcome.stuck)})
    return {
        "seed": config.seed,
        "minutes": config.minutes,
        "fault_every": config.fault_every,
        "notify_shards": outcome.notify_shards,
        "seconds": round(outcome.seconds),
        "faults": dict(sorted(tally.injected.items(), key=lambda kv: (-kv[1], kv[0]))),
        "not_injectable_here": outcome.kinds_unavailable,
        "chunks_written": verdict.written,
        "chunks_delivered": verdict.delivered,
        "generations": verdict.generations,
        "takeovers": verdict.takeovers,
        "ai_sdk_reads_whole": verdict.sessions.get("aisdk answer", 0),
        "ai_sdk_answers_read_whole": len(verdict.aisdk_answers),
        "task_workers_restarted": len(outcome.lost_database),
        "anomalies": anomalies,
    }


def table(report: dict[str, Any]) -> str:
    """The runs of a soak report, a line each, then each run's faults by kind."""
    header = ("seed", "min", "shards", "faults (kinds)", "chunks written / delivered", "generations (taken over)")
    rows = [(*header, "AI SDK reads whole (answers)", "anomalies")]
    for run in report["soak"]:
        rows.append(
            (
                str(run["seed"]),
                f"{run['minutes']:g}",
                str(run["notify_shards"]),
                f"{sum(run['faults'].values())} ({len(run['faults'])})",
                f"{run['chunks_written']:,} / {run['chunks_delivered']:,}",
                f"{run['generations']} ({run['takeovers']})",
                f"{run['ai_sdk_reads_whole']} ({run.get('ai_sdk_answers_read_whole', '-')})",
                str(sum(run["anomalies"].values())),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    for run in report["soak"]:
        lines.append(f"seed {run['seed']}: " + ", ".join(f"{kind} {n}" for kind, n in run["faults"].items()))
    return "\n".join(lines)


def soak(config: SoakConfig, say: Callable[[str], None] = print) -> Outcome:
    outcome = Soak(config, say).run()
    report(outcome, config.seed, say)
    if outcome.anomalies == 0 and not config.keep:
        shutil.rmtree(outcome.run_dir, ignore_errors=True)
    else:
        say(f"soak: the record is kept in {outcome.run_dir}")
    return outcome
