"""The soak's faults: what each kind does (``Injections``), and the schedule the seed draws.

Each kind is a method of ``Injections``, given a random generator of its own; it returns what it
did, or raises ``NotInjected`` when there was nothing to do it to (no backend of that role at
that moment, no PgBouncer on this machine). The schedule is drawn from the seed alone, so a run
replays with the same faults at the same moments; what each fault meets there still depends on
timing. Faults run in threads of their own and overlap; a kind never overlaps itself, and a
server restart excludes the kinds that query the server meanwhile.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from bench import pgserver
from bench.pgbouncer import PgBouncer
from bench.proxy import FreezingProxy

from .processes import QUERY_TIMEOUT, Processes
from .record import DJANGO_CONNECTIONS, GENERATION_LABEL, LABEL, Log
from .servers import ServerPair

ROLES = ("listener", "fetcher", "flusher", "appender")
FROZEN_FOR = 3 * QUERY_TIMEOUT  # a frozen connection is dropped after this (its client gave up on it)
PRUNE_MARGIN = "5 seconds"  # only streams closed longer ago are pruned: none is still being closed


# The backends of this database with an application_name; those whose name and last statement
# match two patterns.
_NAMED_SQL = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s"
_LEASE_SQL = (
    "SELECT pid, application_name FROM pg_stat_activity WHERE datname = current_database()"
    " AND application_name LIKE %s AND query LIKE %s"
)


class NotInjected(Exception):
    """The fault found nothing to act on; it is not counted."""


class Injections:
    """The faults, on what the coordinator holds: the processes, the database (``entry``) and
    its two servers, the freezing proxy, the client proxies, PgBouncer (or why there is none)."""

    def __init__(
        self,
        processes: Processes,
        entry: dict[str, Any],
        servers: ServerPair,
        db_proxy: FreezingProxy,
        client_proxies: list[FreezingProxy],
        bouncer: PgBouncer | None,
        no_bouncer: str,
        log: Log,
    ) -> None:
        self.processes, self.entry, self.servers, self.log = processes, entry, servers, log
        self.db_proxy, self.client_proxies = db_proxy, client_proxies
        self.bouncer, self.no_bouncer = bouncer, no_bouncer
        self.server_lock = threading.Lock()

    def unavailable(self, kind: str) -> str:
        """Why this machine cannot inject ``kind`` ("" if it can)."""
        return self.no_bouncer if kind == "restart-pgbouncer" else ""

    def _db(self) -> psycopg.Connection[Any]:
        return pgserver.connect(self.entry, connect_timeout=3)

    def kill(self, roles: tuple[str, ...], rng: random.Random) -> str:
        alive = [s for s in self.processes.of(*roles) if s.alive() and not s.finished]
        if not alive:
            raise NotInjected("no such process alive")
        slot = rng.choice(alive)
        slot.kill(restart_in=rng.uniform(0.2, 1.5))
        return f"SIGKILL {slot.name}-{slot.incarnation}"

    def stop(self, roles: tuple[str, ...], longest: float, rng: random.Random) -> str:
        """SIGSTOP a process for up to ``longest`` seconds, then SIGCONT: its backends wait on
        it (a writer stopped in a transaction holds its streams' rows), and it finds its
        connections timed out or dropped when it runs again. Its listener's session, left
        blocked sending it notifications, pins the notification queue: stuck for three of its
        ``LISTEN_CHECK_INTERVAL``s (6 s here), the guard of the other processes ends it
        (``NOTIFY_QUEUE_GUARD`` is small here), which the fault watches for and says."""
        alive = [s for s in self.processes.of(*roles) if s.alive() and not s.finished]
        if not alive:
            raise NotInjected("no such process alive")
        slot, seconds = rng.choice(alive), rng.uniform(0.3, longest)
        name = f"{slot.name}-{slot.incarnation}"
        proc = slot.pause()
        if proc is None:
            raise NotInjected(f"{name} had exited")
        listener = f"pgstreams listener {proc.pid}"
        listening, ended = self._sessions(listener), None
        began = time.monotonic()
        try:
            while (left := began + seconds - time.monotonic()) > 0:
                time.sleep(min(left, 0.5))
                if listening and ended is None and not self._sessions(listener):
                    ended = time.monotonic() - began
        finally:
            slot.resume(proc)
        if ended is not None:
            return f"SIGSTOP {name} for {seconds:.2f} s; its listener's session ended after {ended:.1f} s"
        return f"SIGSTOP {name} for {seconds:.2f} s"

    def _sessions(self, application_name: str) -> int:
        """Backends of this database named ``application_name`` (0 if the server cannot say)."""
        try:
            with self._db() as conn:
                return conn.execute(_NAMED_SQL, [application_name]).fetchone()[0]
        except psycopg.Error:
            return 0

    def terminate_backend(self, role: str, rng: random.Random) -> str:
        with self.server_lock, self._db() as conn:
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

    def terminate_generations(self, rng: random.Random) -> str:
        """``pg_terminate_backend`` of a Django connection caught running, or having just run, a
        statement on a generation's lease: a generations thread's (it renews the leases of its
        process's generations a third of a lease apart and looks for takeovers every second,
        its looks ending with a COMMIT), or a task's ``take()``. Looked for during up to 10 s: a
        renewal comes every 0.67 s while any generation is being written."""
        with self.server_lock, self._db() as conn:
            deadline = time.monotonic() + 10.0
            while not (found := conn.execute(_LEASE_SQL, [f"{DJANGO_CONNECTIONS} %", "%pgstreams_lease%"]).fetchall()):
                if time.monotonic() > deadline:
                    raise NotInjected("no connection of a generations thread")
                time.sleep(0.05)
            pid, name = rng.choice(found)
            conn.execute("SELECT pg_terminate_backend(%s)", [pid])
        process = int(name.rsplit(" ", 1)[1])
        whose = [f"{s.name}-{s.incarnation}" for s in self.processes.slots if s.proc and s.proc.pid == process]
        return f"terminated {name} ({', '.join(whose) or 'gone'})"

    def freeze(self, rng: random.Random) -> str:
        frozen = self.db_proxy.freeze()
        if not frozen:
            raise NotInjected("no connection through the proxy")
        return f"froze {frozen} connection(s)"

    def restart_server(self, rng: random.Random) -> str:
        down = rng.uniform(0.1, 1.0)
        with self.server_lock:
            self.servers.restart_primary(down)
        return f"server {self.servers.primary} down {down:.2f} s"

    def promote_standby(self, rng: random.Random) -> str:
        """Switch the servers over: the primary stopped, the standby promoted; the freezing
        proxy and PgBouncer pointed at the new primary once it is, as failover tooling would;
        the old primary back as the standby. The processes' own connections find the new
        primary themselves (libpq's ``target_session_attrs``)."""
        with self.server_lock:
            writable = self.servers.switchover(moved=self._follow_primary)
        return f"server {self.servers.primary} promoted; no primary for {writable:.2f} s"

    def _follow_primary(self) -> None:
        self.db_proxy.upstream = self.servers.primary_socket()
        if self.bouncer is not None:
            self.bouncer.retarget(self.servers.primary_database(self.entry["NAME"]))

    def restart_pgbouncer(self, rng: random.Random) -> str:
        """Stop PgBouncer (its clients' connections cut) and start it again on its port."""
        if self.bouncer is None:
            raise NotInjected(self.no_bouncer)
        down = rng.uniform(0.1, 1.0)
        with self.server_lock:  # its start queries the server through it
            self.bouncer.restart(down)
        return f"down {down:.2f} s, {self.bouncer.logins()} client logins so far"

    def prune(self, rng: random.Random) -> str:
        """Copy the streams closed a while ago into the record, then prune them (in batches
        small enough, now and then, that a stream goes in slices under its readers)."""
        from django.db import connections

        from pgstreams import maintenance

        with self.server_lock, self._db() as conn:
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
            answers = conn.execute(
                "SELECT id, path, (metadata->'pgstreams_generation'->>'attempt')::int FROM pgstreams_stream"
                " WHERE label = %s AND closed_at < %s",
                [GENERATION_LABEL, cutoff],
            ).fetchall()
            for sid, path, attempts in answers:  # pruned too: the check reads their copies
                rows = conn.execute(
                    'SELECT data FROM pgstreams_chunk WHERE stream_id = %s ORDER BY "offset"', [sid]
                ).fetchall()
                self.log(e="pruning-generation", s=path, attempts=attempts, chunks=[data for (data,) in rows])
        batch = rng.choice((25, 200, 10_000))
        try:
            done = maintenance.prune(cutoff, batch=batch, using="soak")
        finally:
            connections.close_all()
        if done.streams != len(doomed) + len(answers):
            self.log(e="prune-race", copied=len(doomed) + len(answers), pruned=done.streams)
        return f"{done.streams} stream(s), {done.chunks} chunk(s), batch {batch}"

    def cut_clients(self, rng: random.Random) -> str:
        cut = rng.choice(self.client_proxies).cut()
        if not cut:
            raise NotInjected("no client connection")
        return f"cut {cut} client connection(s)"

    def pause_standby(self, rng: random.Random) -> str:
        seconds = rng.uniform(0.3, 3.0)
        with self.server_lock, self.servers.replay_paused():
            time.sleep(seconds)
        return f"server {self.servers.standby}'s replay paused {seconds:.2f} s"


def _terminate(role: str) -> Callable[[Injections, random.Random], str]:
    return lambda faults, rng: faults.terminate_backend(role, rng)


# kind: (weight, injection)
KINDS: dict[str, tuple[float, Callable[[Injections, random.Random], str]]] = {
    "kill-writer": (2.0, lambda f, rng: f.kill(("writer",), rng)),
    "kill-reader": (2.0, lambda f, rng: f.kill(("reader", "clients", "aisdk"), rng)),
    "kill-daphne": (1.5, lambda f, rng: f.kill(("daphne",), rng)),
    "stop-writer": (1.0, lambda f, rng: f.stop(("writer",), 2 * QUERY_TIMEOUT, rng)),
    "stop-reader": (1.0, lambda f, rng: f.stop(("reader", "clients", "aisdk"), 12.0, rng)),
    "kill-task-worker": (1.5, lambda f, rng: f.kill(("worker",), rng)),
    "stop-task-worker": (1.5, lambda f, rng: f.stop(("worker",), 2 * QUERY_TIMEOUT, rng)),
    **{f"terminate-{role}": (1.0, _terminate(role)) for role in ROLES},
    "terminate-generations": (1.0, Injections.terminate_generations),
    "freeze": (1.5, Injections.freeze),
    "restart-server": (0.7, Injections.restart_server),
    "restart-pgbouncer": (1.0, Injections.restart_pgbouncer),
    "prune": (1.0, Injections.prune),
    "cut-clients": (2.0, Injections.cut_clients),
    "pause-standby": (1.0, Injections.pause_standby),
    "promote-standby": (0.7, Injections.promote_standby),
}


@dataclass
class Fault:
    at: float  # seconds after the faults begin
    kind: str
    seed: int  # of the fault's own random generator: whom it hits, how long it lasts


def schedule(seed: int, seconds: float, every: float, kinds: list[str]) -> list[Fault]:
    """Faults at random moments (``every`` seconds apart on average) over ``seconds``."""
    rng = random.Random(f"{seed}/faults")
    weights = [KINDS[k][0] for k in kinds]
    faults, at = [], rng.expovariate(1 / every)
    while at < seconds:
        faults.append(Fault(at, rng.choices(kinds, weights)[0], rng.getrandbits(32)))
        at += rng.expovariate(1 / every)
    return faults


@dataclass
class Tally:
    """Faults injected by kind, and those that found nothing to act on or failed to be injected."""

    injected: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    failed: list[str] = field(default_factory=list)


class Injector:
    """Runs a schedule: each fault in a thread of its own at its moment, so that faults overlap
    (a kind does not overlap itself: a fault whose kind is still running is skipped). Drops the
    connections frozen long enough ago, as their clients have given up on them."""

    def __init__(self, injections: Injections, faults: list[Fault], log: Log) -> None:
        self.injections, self.faults, self.log = injections, faults, log
        self.tally = Tally()
        self._running: set[str] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    def run(self, started: float) -> None:
        for fault in self.faults:
            if self._stop.wait(max(0.0, started + fault.at - time.monotonic())):
                break
            self.injections.db_proxy.drop_frozen(FROZEN_FOR)
            with self._lock:  # stop() sets the flag under it: no fault starts after it has looked
                if self._stop.is_set():
                    break
                if fault.kind in self._running:
                    self.tally.skipped[fault.kind] += 1
                    continue
                self._running.add(fault.kind)
                thread = threading.Thread(
                    target=self._inject, args=(fault,), name=f"soak-fault-{fault.kind}", daemon=True
                )
                self._threads.append(thread)
                thread.start()

    def stop(self) -> None:
        """Start no more faults; wait for those running to end; drop every frozen connection."""
        with self._lock:
            self._stop.set()
            threads = list(self._threads)
        for thread in threads:
            thread.join(120)
        self.injections.db_proxy.drop_frozen(0)

    def _inject(self, fault: Fault) -> None:
        try:
            done = KINDS[fault.kind][1](self.injections, random.Random(fault.seed))
        except NotInjected as exc:
            with self._lock:
                self.tally.skipped[fault.kind] += 1
            self.log(e="fault", kind=fault.kind, at=round(fault.at, 3), skipped=str(exc))
        except Exception as exc:  # a fault that could not be injected is reported, never fatal
            with self._lock:
                self.tally.failed.append(f"{fault.kind}: {type(exc).__name__}: {exc}")
            self.log(e="fault", kind=fault.kind, at=round(fault.at, 3), failed=f"{type(exc).__name__}: {exc}")
        else:
            with self._lock:
                self.tally.injected[fault.kind] += 1
            self.log(e="fault", kind=fault.kind, at=round(fault.at, 3), did=done)
        finally:
            with self._lock:
                self._running.discard(fault.kind)
