"""``manage.py pgstreams_partition [--ahead 7]``: partition the chunks by day (the first time:
the table as it is becomes the default partition, in a moment plus one scan of it), and make
the partitions of the days ahead, ``ahead`` at a time (``partitions.ensure``); to run daily, so
that a day's partition exists before its first stream. ``pgstreams_prune`` then drops whole
days. An ``--ahead`` out of range, or a lock not had in time, ends it with a CommandError."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import OperationalError

from pgstreams import conf, partitions


class Command(BaseCommand):
    help = "Partition the chunks by day, so that pruning drops whole days, and make the days ahead."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--ahead",
            type=int,
            default=7,
            help="once a day from today to this many days on lacks its partition, make every day missing to twice as "
            "far (default 7, at most 90)",
        )

    def handle(self, *args: Any, ahead: int, **options: Any) -> None:
        if not isinstance(ahead, int) or not 0 <= ahead <= 90:  # Python 3.11 reads "--ahead=--" as []
            raise CommandError("--ahead needs a whole number of days from 0 to 90")
        converting = not partitions.is_partitioned()
        try:
            made = partitions.convert(ahead) if converting else partitions.ensure(ahead)
        except OperationalError as exc:
            if not partitions.busy(exc):
                raise
            raise CommandError(f"stopped: {partitions.busy_text()}; nothing changed: run it again") from None
        if converting:
            self.stdout.write(
                f"{partitions.TABLE} is partitioned by day: its rows are the partition {partitions.DEFAULT}, "
                "pruned row by row as before"
            )
        days = partitions.days()
        done = f"made {len(made)} day(s)" if made else "no day to make"
        self.stdout.write(f"{done}; the days held run from {days[0][0]} to {days[-1][0]}")
        if not conf.day_partitions():
            self.stderr.write(
                "PGSTREAMS['DAY_PARTITIONS'] is off: new streams get random ids, whose chunks go to the default "
                "partition and are pruned row by row; set it to True in every process"
            )
