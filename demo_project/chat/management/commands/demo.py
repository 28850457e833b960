"""``manage.py demo``: migrate, make sure the demo user exists, start the model's workers (two
``db_worker`` processes) and serve the demo with daphne, stopping the workers when it stops;
``manage.py demo --stop-database`` stops the embedded PostgreSQL that it leaves running."""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from demo_project.workers import Pool

WORKERS = 2


def ensure_demo_user() -> None:
    """The demo user, who may also open the admin and read streams there: staff, with the
    ``pgstreams.view_stream`` permission, the rule the admin and the endpoints share (so it sees
    every stream; in the demo they are all its own)."""
    user, _ = get_user_model().objects.get_or_create(username=settings.DEMO_USERNAME)
    if not user.check_password(settings.DEMO_PASSWORD):
        user.set_password(settings.DEMO_PASSWORD)
    user.is_staff = True
    user.save()
    user.user_permissions.add(Permission.objects.get(content_type__app_label="pgstreams", codename="view_stream"))


def parse_addrport(addrport: str) -> tuple[str, int]:
    host, sep, port = addrport.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise CommandError(f"--addrport must look like 127.0.0.1:8000, not {addrport!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


class Command(BaseCommand):
    help = "Run the pgstreams chat demo: migrate, create the demo user, start two model workers, serve with daphne."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--addrport", default="127.0.0.1:8000", help="where to listen (default 127.0.0.1:8000)")
        parser.add_argument(
            "--workers",
            type=int,
            default=WORKERS,
            help=f"model workers to start (default {WORKERS}; 0: run your own, manage.py db_worker)",
        )
        parser.add_argument(
            "--stop-database",
            action="store_true",
            help="stop the embedded PostgreSQL in .pgdata/ that the demo and the tests leave running, and exit",
        )

    def handle(self, *args: Any, addrport: str, workers: int, stop_database: bool, **options: Any) -> None:
        if stop_database:
            self.stop_database()
            return
        from channels.routing import get_default_application
        from daphne.server import Server

        from demo_project.servers import daphne_endpoint  # with a backlog for a thousand reconnecting browsers

        host, port = parse_addrport(addrport)
        if workers < 0:
            raise CommandError(f"--workers must be 0 (to run your own) or more, not {workers}")
        call_command("migrate", interactive=False, verbosity=0)
        ensure_demo_user()
        shown = f"[{host}]" if ":" in host else host
        self.stdout.write(
            f"pgstreams demo on http://{shown}:{port}/ - sign in as "
            f"{settings.DEMO_USERNAME} / {settings.DEMO_PASSWORD}; Ctrl-C stops it."
        )
        # Named after this process, so that two demos' workers (and the tests') are told apart.
        pool = Pool(workers, f"demo-{os.getpid()}", self._say)
        if workers:
            self.stdout.write("kill a model worker mid-answer (kill -9 PID): another goes on with the answer.")
        self.stdout.flush()
        try:
            Server(
                application=get_default_application(),
                endpoints=[daphne_endpoint(host, port)],
                server_name="pgstreams-demo",
            ).run()
        finally:
            pool.stop()

    def _say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()

    def stop_database(self) -> None:
        from demo_project.database import PGDATA, stop_embedded

        if settings.DATABASES["default"]["ENGINE"] != "demo_project.embedded":
            raise CommandError("DATABASE_URL is set: the demo uses that server, not the embedded one; nothing to stop")
        if stop_embedded():
            self.stdout.write(f"stopped the embedded PostgreSQL in {PGDATA} (remove that folder to delete its data)")
        else:
            self.stdout.write(f"the embedded PostgreSQL in {PGDATA} is not running")
