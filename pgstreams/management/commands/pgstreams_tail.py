"""``manage.py pgstreams_tail <stream_id> [--from N] [--json]``: print a stream's chunks as they
arrive, until it ends; Ctrl-C stops it quietly. A bad id or offset, an unknown stream, or chunks
pruned from under it (the error says which ``--from`` reads what is left) end it with a
CommandError."""

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
        if not isinstance(from_offset, int):  # Python 3.11's argparse reads "--from=--" as []
            raise CommandError("--from needs an offset, a whole number, not '--'")
        try:
            for chunk in pgstreams.read(stream_id, from_offset=from_offset):
                if as_json:
                    self.stdout.write(_line(chunk))
                else:
                    self.stdout.write(chunk.data, ending="")
                self.stdout.flush()
        except KeyboardInterrupt:
            return
        except pgstreams.ChunksPruned as exc:
            raise CommandError(f"{exc}: run it again with --from {exc.first_offset}") from None
        except (pgstreams.StreamNotFound, ValueError, TypeError) as exc:
            raise CommandError(str(exc)) from None
        if not as_json:
            self.stdout.write("")  # end with a newline


def _line(chunk: Any) -> str:
    return json.dumps({"offset": chunk.offset, "data": chunk.data, "created_at": chunk.created_at.isoformat()})
