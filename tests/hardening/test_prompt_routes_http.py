"""Every route that carries a prompt, in every spelling a client can send, through a
real proxy: a prompt over the budget is trimmed or refused, never forwarded whole
(docs/architecture.md §3, §22)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.hardening.raw import Answer, request
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

StartProxy = Callable[..., ProxyProcess]
BUDGET = 300
MODEL = "sim-model"


def _turns(n: int) -> list[tuple[str, str]]:
    return [(f"question {k} " + "lorem " * 30, f"answer {k} " + "ipsum " * 30) for k in range(n)]


def _chat() -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "terse"}]
    for q, a in _turns(30):
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    messages.append({"role": "user", "content": "last"})
    return {"model": MODEL, "messages": messages, "max_tokens": 4}


def _responses() -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for q, a in _turns(30):
        items += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    items.append({"role": "user", "content": "last"})
    return {"model": MODEL, "input": items, "max_output_tokens": 4, "store": False}


def _messages() -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for q, a in _turns(30):
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    messages.append({"role": "user", "content": "last"})
    return {"model": MODEL, "system": "terse", "messages": messages, "max_tokens": 4}


def _completion() -> dict[str, Any]:
    return {"model": MODEL, "prompt": "lorem ipsum dolor " * 200, "max_tokens": 4}


#: path -> (an over-budget body, the list the dialect trims; None: a raw prompt)
ROUTES: dict[str, tuple[Callable[[], dict[str, Any]], str | None]] = {
    "/v1/chat/completions": (_chat, "messages"),
    "/v1/responses": (_responses, "input"),
    "/v1/messages": (_messages, "messages"),
    "/v1/completions": (_completion, None),
}


def spellings(path: str) -> list[str]:
    """``path`` as clients and attackers spell it: dot segments, doubled and trailing
    slashes, escapes of plain letters, another case."""
    rest = path.removeprefix("/v1/")
    last = rest.rsplit("/", 1)[-1]
    escaped = path[: -len(last)] + f"%{ord(last[0]):02x}" + last[1:]
    return [
        path,
        f"/v1/./{rest}",
        f"/v1/x/../{rest}",
        f"/v1/%2e/{rest}",
        f"/v1/%2E/{rest}",
        f"/v1//{rest}",
        f"{path}/",
        f"{path}//",
        f"/x/../v1/{rest}",
        escaped,
        f"/v1/{rest.upper()}",
        f"/v1/{rest.title()}",
        f"/V1/{rest}",
    ]


@pytest.fixture
def proxy(proxy_server: StartProxy) -> ProxyProcess:
    return proxy_server(tokenizer="approx", max_prompt_tokens=BUDGET, upstream_metrics_interval=0)


def _bounded(answer: Answer, sent: dict[str, Any], field: str | None, got: list[Any]) -> str:
    """What became of an over-budget request: ``trimmed`` or ``refused``; fails on a
    request the engine received whole."""
    if answer.status == 200:
        assert field is not None, "a raw prompt over the budget was answered"
        assert int(answer.headers["x-trimproxy-trimmed-messages"]) > 0
        assert int(answer.headers["x-trimproxy-prompt-tokens"]) <= BUDGET
        (received,) = got
        assert len(received["json"][field]) < len(sent[field])
        assert received["prompt_tokens"] <= BUDGET
        return "trimmed"
    assert answer.status in (400, 404), (answer.status, answer.body)
    assert got == [], "a refused request reached the engine"
    return "refused"


@pytest.mark.parametrize("path", list(ROUTES))
def test_over_the_budget_is_trimmed_or_refused_in_every_spelling(
    path: str, proxy: ProxyProcess, sim_upstream: SimUpstream
) -> None:
    make, field = ROUTES[path]
    outcomes: dict[str, str] = {}
    for raw in spellings(path):
        sim_upstream.clear()
        body = make()
        answer = request(proxy.url, "POST", raw, body)
        got = [r for r in sim_upstream.requests() if r["path"].lower().startswith("/v1/")]
        got = [r for r in got if r["path"] != "/v1/models"]
        outcomes[raw] = _bounded(answer, body, field, got)
    # Every spelling that normalises to the route is served by the route's handler.
    served = {raw for raw, what in outcomes.items() if what == "trimmed"}
    if field is not None:
        assert served == set(spellings(path)[:10]), outcomes
    else:
        assert set(outcomes.values()) == {"refused"}


def test_count_tokens_is_answered_here_in_every_spelling(
    proxy: ProxyProcess, sim_upstream: SimUpstream
) -> None:
    path = "/v1/messages/count_tokens"
    body = _messages()
    del body["max_tokens"]
    counts = set()
    for raw in spellings(path):
        answer = request(proxy.url, "POST", raw, body)
        if answer.status == 200:
            counts.add(answer.json()["input_tokens"])
        else:
            assert answer.status == 404, (raw, answer.status)
    assert len(counts) == 1 and counts.pop() > BUDGET
    assert [r for r in sim_upstream.requests() if "count_tokens" in r["path"].lower()] == []
