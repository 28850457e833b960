"""``manage.py pgstreams_soak``: a thin wrapper over ``bench.soak``."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from bench import results
from bench.soak.faults import KINDS
from bench.soak.run import SoakConfig, soak, summary


class Command(BaseCommand):
    help = (
        "Every kind of writer and reader at once, in several processes, under randomized faults "
        "(process kills and stops, backend terminations, frozen connections, server and PgBouncer restarts, "
        "pruning, cut sockets, a paused or promoted standby); then every stream is checked against the table. "
        "Runs on a primary and a standby of its own (the embedded PostgreSQL 18), removed afterwards."
    )

    argv: list[str] = []  # the options as given to manage.py, for the report's "run"

    def run_from_argv(self, argv: list[str]) -> None:
        self.argv = argv[2:]
        super().run_from_argv(argv)

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--minutes", type=float, default=10.0, help="how long faults are injected (default 10)")
        parser.add_argument(
            "--seed",
            "--seeds",
            dest="seeds",
            default=None,
            help="the schedule's seed, or several comma-separated, run one after the other (default: a random "
            "one, printed)",
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
        parser.add_argument(
            "--keep", action="store_true", help="keep the run's record and its servers' directory (stopped)"
        )
        parser.add_argument(
            "--json", dest="json_path", help="write the runs' figures here, as the results page reads them"
        )

    def handle(
        self,
        *args: Any,
        minutes: float,
        seeds: str | None,
        fault_every: float,
        kinds: str,
        notify_shards: int | None,
        keep: bool,
        json_path: str | None,
        **options: Any,
    ) -> None:
        chosen = [k.strip() for k in kinds.split(",") if k.strip()] or None
        unknown = sorted(set(chosen or ()) - set(KINDS))
        if unknown:
            raise CommandError(f"unknown fault kinds {', '.join(unknown)}; choose from {', '.join(KINDS)}")
        if minutes <= 0 or fault_every <= 0 or (notify_shards is not None and notify_shards < 1):
            raise CommandError("--minutes, --fault-every and --notify-shards must be positive")
        try:
            chosen_seeds = [int(s) for s in seeds.split(",")] if seeds else [random.randrange(10**6)]
        except ValueError:
            raise CommandError(f"--seed takes whole numbers, comma-separated, not {seeds!r}") from None
        made = results.facts(self.argv, "pgstreams_soak")

        def say(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        runs, failed = [], []
        for seed in chosen_seeds:
            config = SoakConfig(minutes, seed, keep, fault_every, chosen, notify_shards)
            outcome = soak(config, say)
            runs.append(summary(outcome, config))
            if outcome.anomalies:
                failed.append(f"{outcome.anomalies} anomalies; replay with --seed {seed}")
        if json_path:
            report = {"run": {"kind": "soak", **made}, "soak": runs}
            Path(json_path).parent.mkdir(parents=True, exist_ok=True)
            Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
            say(f"wrote {json_path}")
        if failed:
            raise CommandError("; ".join(failed))
