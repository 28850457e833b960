"""The soak's faults: what each kind does, and the schedule the seed draws.

Each kind is a function of the run (``Target``: the processes, proxies, database server and
standby the coordinator holds) and a random generator; it returns what it did, or raises
``NotInjected`` when there was nothing to do it to (no backend of that role at that moment, no
standby on this machine). The schedule is drawn from the seed alone, so a run replays with the
same faults at the same moments; what each fault meets there still depends on timing.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

ROLES = ("listener", "fetcher", "flusher", "appender")


class NotInjected(Exception):
    """The fault found nothing to act on; it is not counted."""


class Target(Protocol):
    """What faults act on: the coordinator (run.py)."""

    def kill(self, roles: tuple[str, ...], rng: random.Random) -> str: ...
    def terminate_backend(self, role: str, rng: random.Random) -> str: ...
    def freeze(self) -> str: ...
    def restart_server(self, rng: random.Random) -> str: ...
    def prune(self, rng: random.Random) -> str: ...
    def cut_clients(self, rng: random.Random) -> str: ...
    def pause_standby(self, rng: random.Random) -> str: ...
    def available(self, kind: str) -> bool: ...


def _terminate(role: str) -> Callable[[Target, random.Random], str]:
    return lambda target, rng: target.terminate_backend(role, rng)


# kind: (weight, injection)
KINDS: dict[str, tuple[float, Callable[[Target, random.Random], str]]] = {
    "kill-writer": (2.0, lambda t, rng: t.kill(("writer",), rng)),
    "kill-reader": (2.0, lambda t, rng: t.kill(("reader", "clients"), rng)),
    "kill-daphne": (1.5, lambda t, rng: t.kill(("daphne",), rng)),
    **{f"terminate-{role}": (1.0, _terminate(role)) for role in ROLES},
    "freeze": (1.5, lambda t, rng: t.freeze()),
    "restart-server": (0.7, lambda t, rng: t.restart_server(rng)),
    "prune": (1.0, lambda t, rng: t.prune(rng)),
    "cut-clients": (2.0, lambda t, rng: t.cut_clients(rng)),
    "pause-standby": (1.0, lambda t, rng: t.pause_standby(rng)),
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
    (a kind does not overlap itself: a fault whose kind is still running is skipped)."""

    def __init__(self, target: Target, faults: list[Fault], say: Callable[[str], None], log: Any) -> None:
        self.target, self.faults, self.say, self.log = target, faults, say, log
        self.tally = Tally()
        self._running: set[str] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    def run(self, started: float) -> None:
        for fault in self.faults:
            if self._stop.wait(max(0.0, started + fault.at - time.monotonic())):
                break
            with self._lock:
                if fault.kind in self._running:
                    self.tally.skipped[fault.kind] += 1
                    continue
                self._running.add(fault.kind)
            thread = threading.Thread(target=self._inject, args=(fault,), name=f"soak-fault-{fault.kind}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self) -> None:
        """Start no more faults; wait for those running to end."""
        self._stop.set()
        for thread in self._threads:
            thread.join(120)

    def _inject(self, fault: Fault) -> None:
        try:
            done = KINDS[fault.kind][1](self.target, random.Random(fault.seed))
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
