"""The response store's settings: a bad value stops start-up with one line naming it."""

from __future__ import annotations

import pytest

from tests.cli.test_cli import run_cli


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TRIMPROXY_RESPONSE_STORE_ENTRIES", "0"),
        ("TRIMPROXY_RESPONSE_STORE_ENTRIES", "many"),
        ("TRIMPROXY_RESPONSE_STORE_TTL", "0"),
        ("TRIMPROXY_RESPONSE_STORE_TTL", "-5"),
    ],
)
def test_bad_store_setting_stops_start_up_with_one_line_naming_it(
    variable: str, value: str
) -> None:
    out = run_cli("serve", env={variable: value})
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert variable in lines[0]
