"""Reference pages made from the code, so that they cannot drift from it: the settings from their
one declaration each (``pgstreams.conf``), the check ids the settings and ``pgstreams.checks``
give, the Prometheus metrics this process registers, and the management commands' ``--help``.
Each is a directive that writes Markdown and parses it in place."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

PACKAGE = Path(__file__).resolve().parents[2] / "pgstreams"


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|") or " "


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table (the directive's content is parsed as the page's own Markdown)."""
    return [f"| {' | '.join(row)} |" for row in [header, ["---"] * len(header), *rows]]


class _Generated(SphinxDirective):
    def run(self) -> list[nodes.Node]:
        container = nodes.container()
        self.state.nested_parse(StringList(self.lines(), "generated"), self.content_offset, container)
        return container.children

    def lines(self) -> list[str]:
        raise NotImplementedError


class Settings(_Generated):
    """Every key of ``settings.PGSTREAMS``, in declaration order."""

    def lines(self) -> list[str]:
        from pgstreams import conf

        rows = [
            [f"``{s.name}``", f"``{s.default!r}``", _cell(s.doc), _cell(s.rule.text), f"``{s.check_id}``"]
            for s in conf.SETTINGS.values()
        ]
        return _table(["Key", "Default", "Meaning", "Must be", "Check"], rows)


class Checks(_Generated):
    """The check id of each setting; the checks of ``pgstreams.checks`` beyond them must be
    described on the page (a warning, so a failed build, names one that is not)."""

    def lines(self) -> list[str]:
        from pgstreams import conf

        rows = [
            [f"``{s.check_id}``", f"``PGSTREAMS['{s.name}']`` is not {_cell(s.rule.text)}"]
            for s in conf.SETTINGS.values()
        ]
        page = Path(self.env.doc2path(self.env.docname)).read_text()
        declared = {s.check_id for s in conf.SETTINGS.values()}
        for path in sorted(PACKAGE.rglob("*.py")):
            for check_id in re.findall(r'id="(pgstreams\.[EW]\d{3})"', path.read_text()):
                if check_id not in declared and check_id not in page:
                    self.reporter.warning(
                        f"check {check_id} ({path.name}) is not described on this page", line=self.lineno
                    )
        return _table(["Id", "Raised when"], rows)


class Metrics(_Generated):
    """Every ``pgstreams_*`` metric in prometheus_client's registry, as exposed."""

    def lines(self) -> list[str]:
        from prometheus_client import REGISTRY

        from pgstreams import metrics  # noqa: F401  (registers them)

        rows = []
        for family in REGISTRY.collect():
            if family.name.startswith("pgstreams_"):
                exposed = f"``{family.name}_total``" if family.type == "counter" else f"``{family.name}``"
                kind = "histogram (``_bucket``, ``_sum``, ``_count``)" if family.type == "histogram" else family.type
                rows.append([exposed, kind, _cell(family.documentation)])
        return _table(["Metric", "Type", "What it counts"], sorted(rows))


class Commands(_Generated):
    """Each management command's ``--help``, wrapped at 100 columns whatever the builder's terminal."""

    def lines(self) -> list[str]:
        from unittest import mock

        from django.core.management import load_command_class

        lines: list[str] = []
        for path in sorted((PACKAGE / "management" / "commands").glob("pgstreams_*.py")):
            command = load_command_class("pgstreams", path.stem)
            with mock.patch.dict(os.environ, {"COLUMNS": "100"}):  # argparse wraps to COLUMNS
                text = command.create_parser("manage.py", path.stem).format_help()
            lines += ["```{rubric} " + path.stem, "```", "", "```text", *text.splitlines(), "```", ""]
        return lines


def setup(app: Sphinx) -> dict[str, Any]:
    for name, directive in [
        ("pgstreams-settings", Settings),
        ("pgstreams-checks", Checks),
        ("pgstreams-metrics", Metrics),
        ("pgstreams-commands", Commands),
    ]:
        app.add_directive(name, directive)
    return {"parallel_read_safe": True}
