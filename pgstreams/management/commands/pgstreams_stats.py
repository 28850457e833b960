"""``manage.py pgstreams_stats [--json]``: streams, chunks, sizes, the days held (chunks partitioned
by day), the notification queue, settings."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand

from pgstreams import maintenance


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


class Command(BaseCommand):
    help = "Show streams open and closed, chunks, table sizes, the notification queue and settings."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--json", dest="as_json", action="store_true")

    def handle(self, *args: Any, as_json: bool, **options: Any) -> None:
        figures = maintenance.stats()
        if as_json:
            self.stdout.write(_dumps(figures))
            return
        rows = [
            ("database", figures["database"]),
            ("streams open", figures["streams_open"]),
            ("streams closed", figures["streams_closed"]),
            ("chunks", figures["chunks"]),
        ]
        for table, size in figures["sizes"].items():
            rows.append((table, f"{_size(size['table_bytes'])} table, {_size(size['index_bytes'])} indexes"))
        if days := figures["days"]:
            rows.append(("days partitioned", f"{days['count']}, from {days['first']} to {days['last']}"))
        rows.append(("notification queue", f"{figures['notification_queue_usage'] * 100:.4f}% used"))
        rows += [(name, repr(value)) for name, value in figures["settings"].items()]
        width = max(len(name) for name, _ in rows) + 2  # the longest name, then two spaces
        lines = [f"{name:<{width}}{value}" for name, value in rows]
        self.stdout.write("\n".join(lines))


def _dumps(figures: dict[str, Any]) -> str:
    return json.dumps(figures, indent=2, default=str)
