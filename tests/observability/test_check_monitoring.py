"""``scripts/check_monitoring.py`` as CI runs it: promtool on the rules (the Kubernetes
PrometheusRule too), the dashboards' queries, and every metric that they, the rules and
the Kubernetes monitoring objects name against a real proxy's /metrics."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_monitoring.py"
needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool missing (apt package 'prometheus')"
)


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_monitoring", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_promtool
def test_dashboard_and_rules_match_the_proxy() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 failures" in done.stdout


@needs_promtool
def test_a_bad_expression_is_caught() -> None:
    check = load_script()
    assert check.check_exprs_parse(["sum(rate(trimproxy_requests_total[$__rate_interval]))"]) == []
    assert check.check_exprs_parse(["sum(rate(trimproxy_requests_total[5m]"]) != []


def test_names_are_checked_against_what_is_exported() -> None:
    check = load_script()
    text = (
        "# TYPE trimproxy_a counter\ntrimproxy_a_total 1\n"
        "# TYPE trimproxy_h histogram\n"
        "# TYPE trimproxy_g gauge\ntrimproxy_g 0\n"
    )
    sampled, declared = check.exported_series(text)
    assert sampled == {"trimproxy_a_total", "trimproxy_g"}
    assert {"trimproxy_h_bucket", "trimproxy_h_count", "trimproxy_h_sum"} <= declared
    dashboard = {
        "templating": {"list": [{"name": "datasource", "type": "datasource"}]},
        "panels": [
            {"type": "timeseries", "title": "x", "datasource": {"uid": "${datasource}"},
             "fieldConfig": {"defaults": {"noValue": "0"}},
             "targets": [{"expr": "rate(trimproxy_nope_total[5m])"}]},
            {"type": "timeseries", "title": "fixed", "datasource": {"uid": "prom-1"},
             "fieldConfig": {"defaults": {"noValue": "0"}}, "targets": []},
            {"type": "stat", "title": "blank", "datasource": {"uid": "${datasource}"},
             "targets": []},
        ],
    }  # fmt: skip
    exprs, problems = check.dashboard_exprs(dashboard)
    assert exprs == ["rate(trimproxy_nope_total[5m])"]
    assert problems == [
        "panel 'fixed': data source is not ${datasource}",
        "panel 'blank': shows 'No data', not 0, when empty",
    ]
    assert check.METRIC.findall(exprs[0]) == ["trimproxy_nope_total"]
