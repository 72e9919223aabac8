"""Check the dashboard and the alert rules against the proxy they are meant for.

1. ``promtool check rules`` and ``promtool test rules`` on deploy/prometheus, and
   ``promtool check config`` on the example Prometheus configuration;
2. every PromQL expression of the Grafana dashboards (deploy/grafana/*.json) parses
   (promtool checks them as recording rules, template variables filled in), each
   panel's data source is the ``$datasource`` variable and it shows 0, not "No data",
   before its first series;
3. the Kubernetes PrometheusRule (deploy/kubernetes/monitoring) passes
   ``promtool check rules`` too;
4. a real proxy in front of the simulated vLLM upstream, with KV admission on, gets a
   few requests (a plain one, a trimmed one, a session reset, a 400, a 413, an upstream
   500), its /metrics is scraped, and every ``trimproxy_*`` series that the dashboards,
   the rules, the ServiceMonitor and the other Kubernetes monitoring objects name must
   be in it.

Run from the repository root: ``python scripts/check_monitoring.py``. Exit status 0
when all holds; otherwise the failures are listed. Needs ``promtool`` (Debian/Ubuntu
package ``prometheus``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = sorted((ROOT / "deploy/grafana").glob("*.json"))
KUBE_MONITORING = sorted((ROOT / "deploy/kubernetes/monitoring").glob("*.yaml"))
KUBE_RULE = ROOT / "deploy/kubernetes/monitoring/prometheusrule.yaml"
# Other manifests that name proxy metrics (an autoscaler on trimproxy_requests_in_flight).
KUBE_EXAMPLES = sorted((ROOT / "deploy/kubernetes/examples").glob("*.yaml"))
PROM_DIR = ROOT / "deploy/prometheus"
RULES = PROM_DIR / "trimproxy-rules.yml"
RULE_TESTS = PROM_DIR / "trimproxy-rules.test.yml"
PROM_CONFIG = PROM_DIR / "prometheus.yml"
METRIC = re.compile(r"\btrimproxy_[a-zA-Z0-9_]+")
# Grafana's variables, as they expand at query time.
VARIABLES = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$job": ".*",
    "$instance": ".*",
    "$endpoint": ".*",
}
SIM_READY = "trimproxy-sim listening on "


def promtool(*args: str) -> list[str]:
    """Run promtool; the failures it reports (none when it succeeds)."""
    done = subprocess.run(["promtool", *args], capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return []
    return [f"promtool {' '.join(args)}:\n{done.stdout}{done.stderr}"]


def dashboard_exprs(dashboard: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The dashboard's PromQL expressions and its data-source problems."""
    problems: list[str] = []
    variables = {v.get("name"): v for v in dashboard.get("templating", {}).get("list", [])}
    if variables.get("datasource", {}).get("type") != "datasource":
        problems.append("dashboard: no 'datasource' variable of type datasource")
    exprs: list[str] = []
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            continue
        if panel.get("datasource", {}).get("uid") != "${datasource}":
            problems.append(f"panel {panel.get('title')!r}: data source is not ${{datasource}}")
        if panel.get("fieldConfig", {}).get("defaults", {}).get("noValue") != "0":
            problems.append(f"panel {panel.get('title')!r}: shows 'No data', not 0, when empty")
        for target in panel.get("targets", []):
            exprs.append(target["expr"])
    for variable in variables.values():
        query = variable.get("definition")
        if variable.get("type") == "query" and query:
            exprs.append(query)
    return exprs, problems


def check_exprs_parse(exprs: list[str]) -> list[str]:
    """Each expression, variables filled in, as a recording rule for promtool."""
    rules = []
    for i, expr in enumerate(e for e in exprs if not e.startswith("label_values(")):
        for name, value in VARIABLES.items():
            expr = expr.replace(name, value)
        rules.append({"record": f"dashboard:expr_{i}", "expr": expr})
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as tmp:
        json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, tmp)  # JSON is YAML
    try:
        return promtool("check", "rules", tmp.name)
    finally:
        os.unlink(tmp.name)


def rule_exprs() -> list[str]:
    # The rules and the Kubernetes objects are YAML; their metric names are found by
    # pattern, no YAML parser needed.
    return [p.read_text() for p in (RULES, *KUBE_MONITORING, *KUBE_EXAMPLES)]


def check_kube_rule() -> list[str]:
    """The PrometheusRule's groups through ``promtool check rules``."""
    import yaml  # the test extra's; only this check needs it

    spec = yaml.safe_load(KUBE_RULE.read_text())["spec"]
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as tmp:
        json.dump(spec, tmp)  # JSON is YAML
    try:
        return [f"{KUBE_RULE.name}: {f}" for f in promtool("check", "rules", tmp.name)]
    finally:
        os.unlink(tmp.name)


def exported_series(text: str) -> tuple[set[str], set[str]]:
    """Series names with samples, and names declared (a family with no sample yet)."""
    sampled: set[str] = set()
    declared: set[str] = set()
    for family in text_string_to_metric_families(text):
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
        declared.update(family.name + s for s in suffixes.get(family.type, ("",)))
        sampled.update(sample.name for sample in family.samples)
    return sampled, declared


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _http(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None) -> int:
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as err:
        err.read()
        return int(err.code)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


@contextmanager
def running_proxy(workdir: Path) -> Iterator[tuple[str, str]]:
    """A simulated vLLM and a proxy in front of it; yields (proxy URL, sim URL)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMPROXY_")}
    env["PYTHONPATH"] = str(ROOT)
    procs: list[subprocess.Popen[str]] = []
    try:
        sim = subprocess.Popen(
            [sys.executable, "-m", "proxy.sim", "--port", "0"],
            stdout=subprocess.PIPE, text=True, env=env, cwd=workdir,
        )  # fmt: skip
        procs.append(sim)
        assert sim.stdout is not None
        line = sim.stdout.readline()
        if not line.startswith(SIM_READY):
            raise RuntimeError(f"the sim did not start: {line!r}")
        sim_url = line[len(SIM_READY) :].strip()
        port = _free_port()
        env.update(
            TRIMPROXY_UPSTREAM_URL=sim_url,
            TRIMPROXY_MAX_PROMPT_TOKENS="60",
            TRIMPROXY_MAX_BODY_BYTES="2048",
            TRIMPROXY_SESSION_MAX_TURNS="2",
            TRIMPROXY_UPSTREAM_METRICS_INTERVAL="0.2",
            # KV admission on (a fixed capacity far above the traffic): its gauges,
            # wait histogram and rejection counters get their samples.
            TRIMPROXY_KV_ADMISSION="1000000",
        )
        with (workdir / "proxy.log").open("w") as log:
            proxy = subprocess.Popen(
                [sys.executable, "-m", "proxy.cli", "serve", "--port", str(port)],
                stdout=log, stderr=subprocess.STDOUT, text=True, env=env, cwd=workdir,
            )  # fmt: skip
        procs.append(proxy)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                _get(url + "/healthz")
                break
            except OSError:
                if proxy.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        "the proxy did not start:\n" + (workdir / "proxy.log").read_text()
                    ) from None
                time.sleep(0.1)
        yield url, sim_url
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _turns(*contents: str) -> list[dict[str, str]]:
    """Messages alternating user and assistant, starting with user."""
    return [{"role": ("user", "assistant")[i % 2], "content": c} for i, c in enumerate(contents)]


def drive(url: str, sim_url: str) -> str:
    """A few requests that touch every metric; returns the proxy's /metrics."""
    chat = url + "/v1/chat/completions"
    words = " ".join(f"w{i}" for i in range(40))
    session = {"x-session-id": "check-monitoring"}
    # (what, messages, extra body, headers, expected status)
    cases: list[tuple[str, list[dict[str, str]], dict[str, Any], dict[str, str], int]] = [
        ("plain", _turns("hello"), {}, {}, 200),
        ("trimmed", _turns(words, words, "and now?"), {}, {}, 200),
        ("stream", _turns("hi"), {"stream": True}, {}, 200),
        ("session reset", _turns("a", "b", "c", "d", "e"), {}, session, 200),
        ("context_length_exceeded", _turns(words * 3), {}, {}, 400),
        ("too large", _turns("x" * 4096), {}, {}, 413),
    ]
    for what, messages, extra, headers, status in cases:
        body = {"model": "sim-model", "messages": messages, **extra}
        got = _http("POST", chat, body, headers)
        if got != status:
            raise RuntimeError(f"request {what!r}: expected {status}, got {got}")
    # The dialects beside chat: their series carry endpoint="responses" / "messages".
    for path, body in (
        ("/v1/responses", {"model": "sim-model", "input": "hello", "store": False}),
        ("/v1/messages", {"model": "sim-model", "messages": _turns("hello"), "max_tokens": 8}),
    ):
        got = _http("POST", url + path, body)
        if got != 200:
            raise RuntimeError(f"request to {path}: expected 200, got {got}")
    _http("POST", sim_url + "/_sim/config", {"fail_next": {"status": 500}})
    got = _http("POST", chat, {"model": "sim-model", "messages": _turns("x")})
    if got != 500:
        raise RuntimeError(f"upstream failure: expected 500 passed through, got {got}")
    deadline = time.monotonic() + 10
    while True:
        text = _get(url + "/metrics")
        if "trimproxy_upstream_metrics_up 1.0" in text or time.monotonic() > deadline:
            return text
        time.sleep(0.1)


def main() -> int:
    if shutil.which("promtool") is None:
        print("promtool not found: install the 'prometheus' package", file=sys.stderr)
        return 2
    failures = promtool("check", "rules", str(RULES))
    failures += promtool("test", "rules", str(RULE_TESTS))
    failures += promtool("check", "config", str(PROM_CONFIG))
    failures += check_kube_rule()
    exprs: list[str] = []
    for dashboard in DASHBOARDS:
        found, problems = dashboard_exprs(json.loads(dashboard.read_text()))
        exprs += found
        failures += [f"{dashboard.name}: {p}" for p in problems]
    failures += check_exprs_parse(exprs)
    wanted = {m for text in exprs + rule_exprs() for m in METRIC.findall(text)}
    with (
        tempfile.TemporaryDirectory(prefix="check-monitoring-") as tmp,
        running_proxy(Path(tmp)) as (url, sim_url),
    ):
        sampled, declared = exported_series(drive(url, sim_url))
    for name in sorted(wanted - sampled):
        why = "no sample after the test traffic" if name in declared else "not exported"
        failures.append(f"{name}: queried by a dashboard, rule or manifest, {why}")
    for failure in failures:
        print(f"FAIL {failure}", file=sys.stderr)
    print(f"{len(wanted)} metrics queried, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
