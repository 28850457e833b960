"""``manage.py pgstreams_tail <stream_id> [--from N] [--json]``: print a stream's chunks as they
arrive, until it ends; Ctrl-C stops it quietly."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

import pgstreams


class Command(BaseCommand):
    help = "Print a stream's chunks as they arrive, until the stream ends (Ctrl-C stops)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("stream_id")
        parser.add_argument("--from", dest="from_offset", type=int, default=0, help="first offset (default 0)")
        parser.add_argument("--json", dest="as_json", action="store_true", help="one JSON object per chunk and line")

    def handle(self, *args: Any, stream_id: str, from_offset: int, as_json: bool, **options: Any) -> None:
        try:
            for chunk in pgstreams.read(stream_id, from_offset=from_offset):
                if as_json:
                    self.stdout.write(_line(chunk))
                else:
                    self.stdout.write(chunk.data, ending="")
                self.stdout.flush()
        except KeyboardInterrupt:
            return
        except (pgstreams.StreamNotFound, ValueError, TypeError) as exc:
            raise CommandError(str(exc)) from None
        if not as_json:
            self.stdout.write("")  # end with a newline


def _line(chunk: Any) -> str:
    return json.dumps({"offset": chunk.offset, "data": chunk.data, "created_at": chunk.created_at.isoformat()})
