"""``TRIMPROXY_TOKENIZER=auto`` with a proxy that starts before its upstream (the usual
order under compose and Kubernetes): approx at first, the upstream's exact count as
soon as it answers, and the switch logged once."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path

import pytest

from proxy.sim import tokenizer as tok
from tests.support.inprocess import StartApp
from tests.support.processes import LoggedProcess, StackError, child_env, free_port
from tests.support.sim import SIM_READY_PREFIX

CHAT = "/v1/chat/completions"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "How many tokens is this, exactly? " * 3},
]


def start_sim_on(port: int, workdir: Path) -> LoggedProcess:
    args = [sys.executable, "-m", "proxy.sim", "--host", "127.0.0.1", "--port", str(port)]
    sim = LoggedProcess(args, child_env(), workdir, "sim-late")
    deadline = time.monotonic() + 30.0
    while SIM_READY_PREFIX not in sim.logs():
        if not sim.alive() or time.monotonic() > deadline:
            sim.stop()
            raise StackError(f"the sim did not start:\n{sim.logs()}")
        time.sleep(0.05)
    return sim


async def test_auto_switches_to_exact_counts_once_the_upstream_answers(
    app_proxy: StartApp, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trimproxy.tokens")
    port = free_port()
    proxy = await app_proxy(upstream=f"http://127.0.0.1:{port}", tokenizer="auto")
    assert proxy.app.state.services.counter.name == "approx"
    down = await proxy.client.post(CHAT, json={"model": "sim-model", "messages": MESSAGES})
    assert down.status_code == 502

    exact = tok.prompt_tokens(MESSAGES, add_generation_prompt=True)
    sim = start_sim_on(port, tmp_path)
    try:
        seen: list[int] = []
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            r = await proxy.client.post(CHAT, json={"model": "sim-model", "messages": MESSAGES})
            assert r.status_code == 200, r.text
            seen.append(int(r.headers["x-trimproxy-prompt-tokens"]))
            if seen[-1] == exact:
                break
            await asyncio.sleep(0.2)
        assert seen[-1] == exact, seen
        assert r.json()["usage"]["prompt_tokens"] == exact
        # approx counted more at first (a conservative bound), never less.
        assert all(n >= exact for n in seen)
        counter = proxy.app.state.services.counter
        assert counter.exact and counter.name != "approx"
        for _ in range(3):
            again = await proxy.client.post(CHAT, json={"model": "m", "messages": MESSAGES})
            assert again.headers["x-trimproxy-prompt-tokens"] == str(exact)
    finally:
        sim.stop()
    switches = [r for r in caplog.records if "answers now" in r.getMessage()]
    assert len(switches) == 1, [r.getMessage() for r in switches]
    assert "instead of approx" in switches[0].getMessage()


async def test_auto_that_found_an_upstream_does_not_wrap(app_proxy: StartApp) -> None:
    proxy = await app_proxy(tokenizer="auto")
    counter = proxy.app.state.services.counter
    assert type(counter).__name__ == "VllmCounter"
