"""The real Codex CLI with OpenAI's built-in provider pointed at a real ``trimproxy
serve`` in front of the simulated engine, with a low auto-compaction limit: a session
that compacts remotely (``compaction_trigger``) at least twice, every turn exit 0 over
the Responses WebSocket with no fallback, the engine never sent a compaction item and
every prompt within the budget."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from tests.compaction.codex import CODEX, FALLBACK, MISSING, Codex
from tests.compaction.helpers import compaction_items, sent_bodies
from tests.conftest import StartProxy, StartSim
from tests.sessions.helpers import metric_value

WINDOW = 32768
BUDGET = 8000
TURNS = 8

pytestmark = pytest.mark.skipif(not CODEX.exists(), reason=MISSING)


def forwarded(logs: str) -> list[int]:
    return [int(n) for n in re.findall(r'"prompt_tokens_forwarded":(\d+)', logs)]


def test_a_codex_session_compacts_twice_over_the_websocket(
    tmp_path: Path,
    proxy_server: StartProxy,
    sim_upstream_factory: StartSim,
) -> None:
    sim = sim_upstream_factory(max_model_len=WINDOW)
    proxy = proxy_server(
        upstream=sim, tokenizer="upstream", max_prompt_tokens=BUDGET, upstream_metrics_interval=0
    )
    codex = Codex.configured(tmp_path, proxy.api_base, "sim-model", WINDOW)
    outputs = [codex.turn("Say hello.", first=True)]
    # The limit just above what the first turn sent (Codex's own prompt, which
    # changes between its releases): every second turn or so goes past it.
    first = forwarded(proxy.logs())[-1]
    codex.configure(proxy.api_base, "sim-model", WINDOW, first + 50)
    outputs += [codex.turn(f"Tell me more, part {n}.", first=False) for n in range(1, TURNS)]
    for n, done in enumerate(outputs):
        assert done.returncode == 0, f"turn {n}: {done.stdout[-2000:]}"
        assert not any(line in done.stdout for line in FALLBACK), done.stdout[-2000:]
    logs = proxy.logs()
    opened = [line for line in logs.splitlines() if "WebSocket /v1/responses" in line]
    assert len(opened) >= TURNS and all("[accepted]" in line for line in opened)
    text = httpx.get(f"{proxy.url}/metrics", timeout=10).text
    made = metric_value(text, "trimproxy_compactions_total", form="trigger")
    print(f"\n{TURNS} turns, {made:.0f} remote compactions, forwarded {forwarded(logs)}")
    assert metric_value(text, "trimproxy_compactions_total", form="trigger") >= 2
    assert metric_value(text, "trimproxy_compaction_items_total", outcome="refused") == 0
    bodies = sent_bodies(sim)
    assert len(bodies) >= TURNS
    assert all(compaction_items(b) == [] for b in bodies)
    assert all(n <= BUDGET for n in forwarded(logs))
