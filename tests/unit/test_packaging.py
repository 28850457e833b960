"""What ``pip install .`` installs: the app, and nothing of the benchmark; the versions it declares,
as the README, the tutorial and CI state them."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pgstreams
from tests.helpers import ROOT


def test_the_wheel_holds_the_app_and_no_benchmark_code(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: building writes build/ and *.egg-info next to the code
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(".git", ".venv*", ".pgdata", "build", "_build", "node_modules", "*.egg-info"),
    )
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
    wheel = next(tmp_path.glob("pgstreams-*.whl"))
    assert wheel.name.startswith(f"pgstreams-{pgstreams.__version__}-")  # the version is declared once
    names = zipfile.ZipFile(wheel).namelist()
    assert "pgstreams/listener.py" in names and "pgstreams/static/pgstreams/pgstreams.js" in names
    assert "pgstreams/templatetags/pgstreams.py" in names and "pgstreams/templates/pgstreams/stream_html.html" in names
    assert not [name for name in names if "bench" in name or name.startswith(("tests/", "demo_project/"))]


def test_the_changelog_starts_with_the_version_of_the_code() -> None:
    """CHANGELOG.md's first entry is the version pgstreams says it is."""
    first = re.search(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert first and first[1] == pgstreams.__version__


def metadata() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def classified(prefix: str) -> list[str]:
    """The versions the classifiers under ``prefix`` name, oldest first."""
    names = [c.removeprefix(prefix) for c in metadata()["classifiers"] if c.startswith(prefix)]
    return sorted((n for n in names if re.fullmatch(r"\d+\.\d+", n)), key=lambda v: tuple(map(int, v.split("."))))


def test_the_readme_and_the_guide_state_the_versions_the_package_declares() -> None:
    django, python = classified("Framework :: Django :: "), classified("Programming Language :: Python :: ")
    assert django[0] == "5.2" and len(django) >= 3 and python[0] == "3.11" and len(python) >= 3
    stated = (
        f"Supported: Django {django[0]} LTS, {', '.join(django[1:-1])} and {django[-1]}, "
        f"on Python {', '.join(python[:-1])} and {python[-1]}"
    )
    for doc in ("README.md", "docs/tutorial.md"):
        assert stated in " ".join((ROOT / doc).read_text().split()), f"{doc} should say: {stated}"
    project = metadata()
    assert project["requires-python"] == f">={python[0]}"
    # The lowest supported Django, and no cap: pip must never downgrade a project's Django.
    assert f"Django>={django[0]}" in project["dependencies"]
    # This repository's own environment: the versions tested, up to the newest.
    major, minor = django[-1].split(".")
    tested = f"Django>={django[0]},<{major}.{int(minor) + 1}"
    assert re.search(rf"^{re.escape(tested)}\s", (ROOT / "requirements.txt").read_text(), re.M), tested


def test_the_channels_extra_brings_channels_and_daphne_without_the_known_vulnerabilities() -> None:
    extras = metadata()["optional-dependencies"]
    assert "channels>=4.3.2,<5" in extras["channels"] and "daphne>=4.2.2,<5" in extras["channels"]
    assert extras["binary"] == ["psycopg[binary]>=3.2,<4"]


def test_ci_runs_a_supported_django_on_a_supported_python_in_each_leg() -> None:
    """Each leg of .ci/run names its Python and Django series; both are among the classifiers."""
    legs = re.findall(r"^(?:\w+=\S+ )*leg (\d+\.\d+) (\d+\.\d+) ", (ROOT / ".ci" / "run").read_text(), re.M)
    assert len(legs) >= 2, "no legs found in .ci/run"
    django, python = classified("Framework :: Django :: "), classified("Programming Language :: Python :: ")
    for leg_python, leg_django in legs:
        assert leg_python in python and leg_django in django
    assert {leg[1] for leg in legs} >= {django[0], django[-1]}  # the LTS and the latest
