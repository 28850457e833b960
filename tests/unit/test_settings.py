"""The settings' declarations: every one has a check of its own (the documentation's table is made
from them, docs/_ext/reference.py)."""

from __future__ import annotations

from pgstreams import conf


def test_every_setting_has_its_own_check_id() -> None:
    ids = [setting.check_id for setting in conf.SETTINGS.values()]
    assert len(set(ids)) == len(ids) and all(i.startswith("pgstreams.E") for i in ids)
