"""The compose quickstart, up for real: trimproxy (two replicas), Redis, Prometheus and
the simulated engine. A chat completion goes through; a session's turn limit holds
across the replicas (the reset point is in the shared Redis); Prometheus scrapes both
replicas; ``compose down`` with a stream open lets that stream finish and the proxies
exit by themselves. The last test takes the stack down: keep it last."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.deploy.containers.engine import Engine
from tests.deploy.containers.stack import MODEL, REPLICAS, Stack, project, start

pytestmark = pytest.mark.container


@pytest.fixture(scope="module")
def stack(
    picked: tuple[Engine, tuple[str, ...], dict[str, str]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    engine, command, images = picked
    compose = project(command, images, tmp_path_factory.mktemp("stack"))
    try:
        yield start(engine, compose)
    finally:
        compose("down", "-v", timeout=180, check=False)


def chat(url: str, messages: list[dict[str, str]], **headers: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": MODEL, "messages": messages, "max_tokens": 2},
        headers=headers,
        timeout=60,
    )


def conversation(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are terse."}]
    for turn in range(1, turns + 1):
        messages.append({"role": "user", "content": f"question {turn}"})
        if turn < turns:
            messages.append({"role": "assistant", "content": f"answer {turn}"})
    return messages


def test_a_chat_completion_goes_through(stack: Stack) -> None:
    for url in stack.proxy_urls:
        answer = chat(url, conversation(1))
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["model"] == MODEL and body["choices"][0]["message"]["content"]
        assert body["usage"]["prompt_tokens"] > 0


def test_each_replica_routes_over_the_three_engines(stack: Stack) -> None:
    for url in stack.proxy_urls:
        ready = httpx.get(f"{url}/readyz", timeout=10).json()
        assert (ready["engines"], ready["engines_up"]) == (3, 3), ready
    sent: dict[str, float] = {}
    for i in range(9):  # nine sessions: rendezvous hashing spreads them
        assert (
            chat(
                stack.proxy_urls[0], conversation(1), **{"X-Session-ID": f"spread-{i}"}
            ).status_code
            == 200
        )
    for line in httpx.get(f"{stack.proxy_urls[0]}/metrics", timeout=10).text.splitlines():
        if line.startswith("trimproxy_engine_requests_total{"):
            sent[line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
    assert len(sent) == 3 and sum(1 for n in sent.values() if n > 0) >= 2, sent


def test_a_sessions_turn_limit_holds_across_the_replicas(stack: Stack) -> None:
    """TRIMPROXY_SESSION_MAX_TURNS=2, reset (compose.ci.yaml). Turn 3 on replica A
    resets the session; turn 4 on replica B must count from that reset point (turn 2):
    a replica that did not see it would count 4 user turns and reset again."""
    first, second = stack.proxy_urls
    session = {"X-Session-ID": f"ct-{uuid.uuid4().hex}"}
    seen = []
    for turns, url in ((1, first), (2, second), (3, first), (4, second)):
        answer = chat(url, conversation(turns), **session)
        assert answer.status_code == 200, answer.text
        seen.append(
            (
                answer.headers["X-Trimproxy-Session-Turn"],
                answer.headers.get("X-Trimproxy-Session-Reset"),
            )
        )
    assert seen == [("1", None), ("2", None), ("1", "1"), ("2", None)]


def _prometheus(stack: Stack, path: str, **params: str) -> Any:
    answer = httpx.get(f"{stack.prometheus_url}/api/v1/{path}", params=params, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()["data"]


def _wait_for(predicate: Any, what: str, attempts: int = 90) -> Any:
    """Poll ``predicate`` (once a second; the scrape interval is compose's 15 s)."""
    for _ in range(attempts):
        found = predicate()
        if found:
            return found
        time.sleep(1)
    pytest.fail(f"Prometheus never showed {what}")


def test_prometheus_scrapes_both_replicas(stack: Stack) -> None:
    def up_targets() -> set[str]:
        active = _prometheus(stack, "targets", state="active")["activeTargets"]
        mine = [t for t in active if t["labels"]["job"] == "trimproxy"]
        if len(mine) == REPLICAS and all(t["health"] == "up" for t in mine):
            return {t["labels"]["instance"] for t in mine}
        return set()

    instances = _wait_for(up_targets, f"{REPLICAS} trimproxy targets up")

    def prompt_token_samples() -> set[str]:
        query = 'sum by (instance) (trimproxy_prompt_tokens_count{stage="received"})'
        result = _prometheus(stack, "query", query=query)["result"]
        found = {r["metric"]["instance"] for r in result if float(r["value"][1]) > 0}
        return found if found == instances else set()

    # Both replicas served chats in the tests above.
    assert _wait_for(prompt_token_samples, "trimproxy_prompt_tokens of both replicas")


def test_compose_down_lets_an_open_stream_finish(stack: Stack) -> None:
    # The proxies' exit codes, read as they stop (down removes them right after).
    waits = [
        subprocess.Popen([stack.engine.name, "wait", c], stdout=subprocess.PIPE, text=True)
        for c in stack.proxies
    ]
    down: list[subprocess.CompletedProcess[str]] = []
    started = threading.Event()

    def take_down() -> None:
        started.wait(60)
        argv = stack.compose.argv("down")
        down.append(subprocess.run(argv, capture_output=True, text=True, check=False))

    taker = threading.Thread(target=take_down)
    taker.start()
    events = []
    with httpx.stream(
        "POST",
        f"{stack.proxy_urls[0]}/v1/chat/completions",
        json={"model": MODEL, "messages": conversation(1), "stream": True},
        timeout=60,
    ) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
                started.set()
    taker.join(180)
    assert events[-1] == "[DONE]", events[-3:]
    # The sim answers 40 tokens (compose.ci.yaml), one chunk each, plus the final chunk.
    assert len(events) >= 40, len(events)
    assert down and down[0].returncode == 0, down and down[0].stderr
    codes = [w.communicate(timeout=60)[0].strip() for w in waits]
    # 0: each proxy drained and exited by itself; 137 would be the SIGKILL at the end
    # of stop_grace_period.
    assert codes == ["0"] * REPLICAS, codes
