"""Django settings of the soak's worker and server processes: the demo's, with the database
aliases and PGSTREAMS overrides the coordinator passes in the environment (``SOAK_DATABASES``,
``SOAK_PGSTREAMS``: JSON). ``DATABASE_URL`` is the soak's own database, whose connections say
whose they are in ``application_name``. SIGUSR1 prints the process's threads' and tasks' stacks.
pgstreams' warnings and notes are logged: what a process met on its way (a reconnect, a client given up)."""

import asyncio
import faulthandler
import json
import os
import signal
import sys

from bench.soak.record import DJANGO_CONNECTIONS
from demo_project.database import from_url
from demo_project.settings import *  # noqa: F403

DATABASES = {"default": from_url(os.environ["DATABASE_URL"])}
# Django's own connections named, so that a fault can find one (a generations thread's, say).
DATABASES["default"].setdefault("OPTIONS", {})["application_name"] = f"{DJANGO_CONNECTIONS} {os.getpid()}"
for _alias, _url in json.loads(os.environ.get("SOAK_DATABASES", "{}")).items():
    DATABASES[_alias] = from_url(_url)

PGSTREAMS = {**PGSTREAMS, **json.loads(os.environ.get("SOAK_PGSTREAMS", "{}"))}  # noqa: F405

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"pgstreams": {"handlers": ["console"], "level": "INFO"}},
}


def _dump_stacks(signum: int, frame: object) -> None:
    """SIGUSR1 (the coordinator's, at a reader it finds stuck): every thread's stack and every
    asyncio task's, on stderr (the process's ``proc/*.err``)."""
    faulthandler.dump_traceback(all_threads=True)
    loop = asyncio._get_running_loop()
    tasks = asyncio.all_tasks(loop) if loop is not None else set()
    print(f"{len(tasks)} asyncio tasks in the main thread's loop ({loop!r})", file=sys.stderr)
    for task in tasks:
        try:
            task.print_stack(file=sys.stderr)
        except Exception as exc:  # a stack that cannot be printed: say so, go on with the others
            print(f"{task!r}: {exc!r}", file=sys.stderr)
    sys.stderr.flush()


signal.signal(signal.SIGUSR1, _dump_stacks)
