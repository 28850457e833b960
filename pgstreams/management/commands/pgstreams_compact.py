"""``manage.py pgstreams_compact --closed-before 1h [--batch 10000] [--dry-run]``: fold the chunks
of streams closed before a cutoff into runs, a few rows a stream instead of one a chunk, in short
transactions; every read answers as before. A cutoff that is no age or date ends it with a
CommandError that says what is accepted."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from pgstreams import maintenance


class Command(BaseCommand):
    help = "Fold the chunks of streams closed before a cutoff into runs (fewer rows, less disk), in short batches."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--closed-before", required=True, help="an age (7d, 12h, 30m, 2w) or an ISO date")
        parser.add_argument(
            "--batch",
            type=int,
            default=10_000,
            help="chunks per transaction (default 10000); a run holds no more, so under 4096 runs are shorter",
        )
        parser.add_argument("--dry-run", action="store_true", help="say what would be compacted, change nothing")

    def handle(self, *args: Any, closed_before: str, batch: int, dry_run: bool, **options: Any) -> None:
        if not isinstance(closed_before, str):  # Python 3.11's argparse reads "--closed-before=--" as []
            raise CommandError("--closed-before needs an age (7d, 12h, 30m, 2w) or an ISO date, not '--'")
        if not isinstance(batch, int) or batch < 1:
            raise CommandError("--batch needs a whole number of chunks, at least 1")
        try:
            cutoff = maintenance.parse_cutoff(closed_before)
        except ValueError as exc:
            raise CommandError(f"--closed-before {exc}") from None
        streams, chunks = maintenance.compactable(cutoff)
        if not streams:
            self.stdout.write(f"nothing to compact: every stream closed before {cutoff.isoformat()} is compacted")
            return
        verb = "would compact" if dry_run else "compacting"
        self.stdout.write(f"{verb} {streams} stream(s) closed before {cutoff.isoformat()}, with {chunks} chunk(s)")
        if dry_run:
            return
        done = maintenance.compact(cutoff, batch=batch)
        self.stdout.write(f"compacted {done.streams} stream(s): {done.chunks} chunk(s) into {done.runs} run(s)")
