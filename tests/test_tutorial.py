"""The tutorial (docs/tutorial.md) followed as written: a project that ``django-admin startproject`` made, with the
tutorial's files added, checks clean, and a visitor's question becomes a stream its page reads live
over WebSocket (in Chromium) and that SSE serves whole."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import serving
from tests.helpers import ROOT, free_port
from tests.helpers import make_project as project

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess]

TUTORIAL = ROOT / "docs" / "tutorial.md"


def tutorial_files() -> dict[str, str]:
    """The tutorial's blocks, by the file their first line names (the last block of a file shown
    twice)."""
    sections = TUTORIAL.read_text()
    files = {}
    for language, block in re.findall(r"```(python|html)\n(.*?)```", sections, re.S):
        named = re.match(r"# (\S+\.py)|<!-- (\S+) -->", block)
        assert named, f"a {language} block of the tutorial names no file: {block[:60]!r}"
        files[named[1] or named[2]] = block
    return files


def make_project(folder: Path) -> None:
    """startproject, then the tutorial's files; the test's own database in place of the tutorial's."""
    files = tutorial_files()
    expected = {"myproject/settings.py", "myproject/asgi.py", "myproject/urls.py", "myapp/views.py"}
    assert set(files) == expected | {"myapp/templates/answer.html"}
    project(folder, files)


# pgstreams from this checkout; the project's own settings (the suite's environment names the demo's).
PROJECT = {"PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "myproject.settings"}


def manage(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "manage.py", *args]
    env = {**os.environ, **PROJECT}
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=120)


def sse_text(host: str, stream_id: str) -> str:
    """The stream's chunks joined, read over SSE to its end event."""
    text, event = "", None
    with httpx.stream("GET", f"http://{host}/pgstreams/streams/{stream_id}/events", timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: ") and event is None:
                text += json.loads(line.removeprefix("data: "))["data"]
            elif line.startswith("data: ") and event == "end":
                return text
    raise AssertionError(f"the SSE response ended without its end event, after {text!r}")


def test_a_project_made_by_following_the_tutorial_streams_an_answer_to_its_page_and_over_sse(tmp_path, page) -> None:
    make_project(tmp_path)
    checked = manage(tmp_path, "check")
    assert checked.returncode == 0 and "pgstreams." not in checked.stdout + checked.stderr, checked.stderr
    migrated = manage(tmp_path, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    port = free_port()
    command = [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"]
    with serving(command, port, env=PROJECT, cwd=tmp_path) as host:
        page.goto(f"http://{host}/ask/")  # an anonymous visitor
        page.fill("input[name=prompt]", "what does it cost?")
        page.click("button")
        page.wait_for_function("document.querySelector('#answer').textContent.endsWith('cost? ')")
        assert page.eval_on_selector("#answer", "el => el.textContent") == "You asked: what does it cost? "
        stream_id = re.search(r"/ws/pgstreams/([0-9a-f-]{36})/", page.content())[1]
        assert sse_text(host, stream_id) == "You asked: what does it cost? "
