"""``trimproxy top --once`` against a real proxy that served a chat, a Responses and a
Messages request: one endpoint row each, with what ``/metrics`` says of it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from tests.observability.promtext import scrape
from tests.observability.test_endpoint_label import ROUTES, send_each, start
from tests.support.processes import ProxyProcess


def test_top_has_a_row_per_endpoint(proxy_server: Callable[..., ProxyProcess]) -> None:
    proxy = start(proxy_server)
    send_each(proxy.url)
    out = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "top", proxy.url, "--once"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    screen = out.splitlines()
    head = next(i for i, line in enumerate(screen) if line.startswith("endpoint "))
    assert screen[head].split()[:2] == ["endpoint", "prompts"], out  # totals: no rates yet
    rows = {line.split()[0]: line.split() for line in screen[head + 1 :] if line.strip()}
    # Completions has had nothing (its refusal counters read 0): no row.
    assert list(rows) == list(ROUTES), out
    m = scrape(proxy.url)
    for endpoint, cells in rows.items():
        assert cells[1] == "1"  # one prompt each
        assert cells[2].startswith("<=") and cells[4].startswith("<="), cells  # p50s
        trims = m.value("trimproxy_trim_events_total", endpoint=endpoint)
        resets = m.value("trimproxy_session_limit_total", endpoint=endpoint, action="reset")
        assert cells[6:] == [str(int(trims)), str(int(resets)), "0"], cells
