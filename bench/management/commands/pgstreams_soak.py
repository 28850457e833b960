"""``manage.py pgstreams_soak``: a thin wrapper over ``bench.soak``."""

from __future__ import annotations

import random
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from bench.soak.faults import KINDS
from bench.soak.run import SoakConfig, soak


class Command(BaseCommand):
    help = (
        "Every kind of writer and reader at once, in several processes, under randomized faults "
        "(process kills and stops, backend terminations, frozen connections, server and PgBouncer restarts, "
        "pruning, cut sockets, a paused standby); then every stream is checked against the table. Runs in a "
        "database of its own on the server of DATABASES['default'], dropped afterwards."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--minutes", type=float, default=10.0, help="how long faults are injected (default 10)")
        parser.add_argument(
            "--seed", type=int, default=None, help="the schedule's seed (default: a random one, printed)"
        )
        parser.add_argument("--fault-every", type=float, default=2.2, help="seconds between faults, on average")
        parser.add_argument(
            "--kinds", default="", help=f"comma-separated fault kinds (default all: {', '.join(KINDS)})"
        )
        parser.add_argument(
            "--notify-shards",
            type=int,
            default=None,
            help="NOTIFY_SHARDS of every process (default: 1 or 1024, drawn from the seed)",
        )
        parser.add_argument("--keep", action="store_true", help="keep the run's database and record")

    def handle(
        self,
        *args: Any,
        minutes: float,
        seed: int | None,
        fault_every: float,
        kinds: str,
        notify_shards: int | None,
        keep: bool,
        **options: Any,
    ) -> None:
        chosen = [k.strip() for k in kinds.split(",") if k.strip()] or None
        unknown = sorted(set(chosen or ()) - set(KINDS))
        if unknown:
            raise CommandError(f"unknown fault kinds {', '.join(unknown)}; choose from {', '.join(KINDS)}")
        if minutes <= 0 or fault_every <= 0 or (notify_shards is not None and notify_shards < 1):
            raise CommandError("--minutes, --fault-every and --notify-shards must be positive")
        seed = random.randrange(10**6) if seed is None else seed

        def say(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        config = SoakConfig(minutes, seed, keep, fault_every, chosen, notify_shards)
        outcome = soak(config, say)
        if outcome.anomalies:
            raise CommandError(f"{outcome.anomalies} anomalies; replay with --seed {seed}")
