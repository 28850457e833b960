"""The entry point of the soak's worker processes:
``python -m bench.soak.worker ROLE SLOT INCARNATION RUN_DIR SEED`` sets Django up (the settings of
``bench.soak.settings``), then runs the role's ``main()``: ``writers``, ``readers`` or
``clients``. The roles' modules are imported only then, as they need the app registry."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import django


def main(argv: list[str]) -> None:
    module, slot, incarnation, run_dir, seed = argv
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.soak.settings")
    django.setup()
    from .record import Worker

    role = {"writers": "writer", "readers": "reader", "clients": "clients"}[module]
    worker = Worker(role, int(slot), int(incarnation), Path(run_dir), int(seed))
    importlib.import_module(f"bench.soak.{module}").main(worker)


if __name__ == "__main__":
    main(sys.argv[1:])
