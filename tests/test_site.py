"""The documentation site: Sphinx builds docs/ with warnings as errors (a broken link, a reference
page that cannot be made from the code, a check no page describes), the reference pages hold
what the code declares, and the built tutorial renders in Chromium."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from pgstreams import conf, metrics
from tests.helpers import ROOT


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for the module, in a process of its own (docs/conf.py configures
    Django for itself)."""
    out = tmp_path_factory.mktemp("site")
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "docs", str(out)]
    built = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-4000:]
    return out


def text_of(site: Path, page: str) -> str:
    return re.sub(r"<[^>]+>", " ", (site / page).read_text())


def test_the_settings_page_has_every_declared_setting_with_its_check(site: Path) -> None:
    html = (site / "reference" / "settings.html").read_text()
    for setting in conf.SETTINGS.values():
        row = re.search(rf"<tr[^>]*>\s*<td><p><code[^>]*><span class=\"pre\">{setting.name}</span>.*?</tr>", html, re.S)
        assert row and setting.check_id in row[0], setting.name


def test_the_metrics_page_has_every_metric_the_process_registers(site: Path) -> None:
    page = text_of(site, "reference/metrics.html")
    families = [family for family in REGISTRY.collect() if family.name.startswith("pgstreams_")]
    assert metrics.REGISTRY is REGISTRY and len(families) > 10  # pgstreams.metrics registers them there
    for family in families:
        assert (family.name + "_total" if family.type == "counter" else family.name) in page


def test_the_api_page_shows_the_docstrings(site: Path) -> None:
    page = text_of(site, "reference/api.html")
    assert "Yield every chunk with offset" in page  # read()'s docstring
    assert "ChunksPruned" in page and "first_offset" in page


def test_the_built_tutorial_renders_in_chromium(site: Path, page) -> None:
    page.goto((site / "tutorial.html").as_uri())
    assert page.title().startswith("Tutorial: a first live stream")
    assert page.locator("h2").all_inner_texts()[:3] == ["1. Install", "2. Mount the routes", "3. Write and read"]
    assert "def ask(request):" in page.inner_text("article")  # the code it runs, rendered
    for caption in ("How-to guides", "Reference", "Explanations"):
        assert caption in page.text_content(".sidebar-drawer")  # (shown in capitals by CSS)
    page.locator("article a[href='howto/htmx.html']").click()  # the tutorial's "Next"
    page.wait_for_url("**/howto/htmx.html")
    assert "{% stream_html stream %}" in page.inner_text("article")
