"""What ``pip install .`` installs: the app, and nothing of the benchmark."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.helpers import ROOT


def test_the_wheel_holds_the_app_and_no_benchmark_code(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: building writes build/ and *.egg-info next to the code
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", ".pgdata", "build", "*.egg-info"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    names = zipfile.ZipFile(next(tmp_path.glob("pgstreams-*.whl"))).namelist()
    assert "pgstreams/listener.py" in names and "pgstreams/static/pgstreams/pgstreams.js" in names
    assert not [name for name in names if "bench" in name or name.startswith(("tests/", "demo_project/"))]
