"""The README's settings table names every setting of ``proxy.settings.Settings``, and
nothing that is no setting."""

from __future__ import annotations

import re

from proxy.settings import ENV_PREFIX, Settings
from tests.support.processes import REPO_ROOT


def table_names() -> set[str]:
    text = (REPO_ROOT / "README.md").read_text("utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| `TRIMPROXY_")]
    return {
        name for row in rows for name in re.findall(r"`(TRIMPROXY_[A-Z_]+)`", row.split("|")[1])
    }


def test_the_settings_table_names_every_setting_and_only_settings() -> None:
    settings = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    names = table_names()
    assert settings - names == set(), "settings missing from README.md's table"
    assert names - settings == set(), "names in README.md's table that are no setting"
