"""The settings' declarations: the README's table is theirs, and every one has a check."""

from __future__ import annotations

from pgstreams import conf
from tests.helpers import ROOT


def table_row(setting: conf.Setting) -> str:
    default = setting.default
    shown = f'"{default}"' if isinstance(default, str) else repr(default)
    return f"| `{setting.name}` | `{shown}` | {setting.doc} |"


def test_the_readme_settings_table_is_the_declarations() -> None:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("| key | default | meaning |\n| --- | --- | --- |\n")
    rows = readme[start:].split("\n\n", 1)[0].splitlines()[2:]
    # On failure, the expected rows are the table to paste into the README.
    assert rows == [table_row(setting) for setting in conf.SETTINGS.values()]


def test_every_setting_has_its_own_check_id() -> None:
    ids = [setting.check_id for setting in conf.SETTINGS.values()]
    assert len(set(ids)) == len(ids) and all(i.startswith("pgstreams.E") for i in ids)
