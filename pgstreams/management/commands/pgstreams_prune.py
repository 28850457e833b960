"""``manage.py pgstreams_prune --closed-before 7d [--batch 10000] [--dry-run]``: delete closed
streams and their chunks in short batches, and streams whose Durable Streams expiry has passed;
other open streams are never touched. A cutoff that is no age or date, or an age reaching back
before the year 1, ends it with a CommandError that says what is accepted."""

from __future__ import annotations

import datetime
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import OperationalError
from django.db.models import ProtectedError, RestrictedError

from pgstreams import maintenance, partitions


def _cutoff(value: str) -> datetime.datetime:
    """``value`` as ``maintenance.parse_cutoff`` reads it, or a CommandError saying why not."""
    try:
        return maintenance.parse_cutoff(value)
    except ValueError as exc:
        raise CommandError(f"--closed-before {exc}") from None


class Command(BaseCommand):
    help = "Delete streams closed before a cutoff, with their chunks, in short batches."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--closed-before", required=True, help="an age (7d, 12h, 30m, 2w) or an ISO date")
        parser.add_argument("--batch", type=int, default=10_000, help="chunks per transaction (default 10000)")
        parser.add_argument("--dry-run", action="store_true", help="say what would be deleted, delete nothing")

    def handle(self, *args: Any, closed_before: str, batch: int, dry_run: bool, **options: Any) -> None:
        # Python 3.11's argparse reads "--closed-before=--" as [], and "--batch=--" too.
        if not isinstance(closed_before, str):
            raise CommandError("--closed-before needs an age (7d, 12h, 30m, 2w) or an ISO date, not '--'")
        if not isinstance(batch, int):
            raise CommandError("--batch needs a whole number of chunks, not '--'")
        cutoff = _cutoff(closed_before)
        if batch < 1:
            raise CommandError("--batch must be at least 1")
        if dry_run:
            self.stdout.write(f"would remove {maintenance.expired()} expired stream(s)")
        else:
            self.stdout.write(f"removed {maintenance.prune_expired()} expired stream(s)")
        todo = maintenance.prunable(cutoff)
        if not todo.streams:
            self.stdout.write(f"nothing to delete: no stream was closed before {cutoff.isoformat()}")
            return
        verb = "would delete" if dry_run else "deleting"
        self.stdout.write(
            f"{verb} {todo.streams} stream(s) closed before {cutoff.isoformat()}, with {todo.chunks} chunk(s)"
        )
        if dry_run:
            return
        show = self.stdout.isatty() if hasattr(self.stdout, "isatty") else sys.stdout.isatty()

        def progress(done: maintenance.Pruned) -> None:
            if show:
                share = done.chunks / todo.chunks if todo.chunks else done.streams / todo.streams
                bar = "#" * int(30 * min(share, 1.0))
                self.stdout.write(f"\r[{bar:<30}] {done.streams}/{todo.streams} streams", ending="")
                self.stdout.flush()

        try:
            done = maintenance.prune(cutoff, batch=batch, progress=progress)
        except (ProtectedError, RestrictedError) as exc:
            raise CommandError(
                f"stopped: {exc.args[0]} (a stream closed before the cutoff is kept by objects of the project that "
                "point at it); delete them, or give a later cutoff"
            ) from None
        except OperationalError as exc:
            if not partitions.busy(exc):
                raise
            raise CommandError(
                f"stopped: {partitions.busy_text()}, to drop a day; what was deleted stays deleted, and the day's "
                "chunks go at the next prune: run it again"
            ) from None
        if show:
            self.stdout.write("")
        self.stdout.write(f"deleted {done.streams} stream(s) and {done.chunks} chunk(s)")
