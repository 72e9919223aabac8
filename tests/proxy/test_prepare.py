"""The prepare step on its own: no HTTP, an in-memory counter, the real trimming.

``prepare`` decides what goes upstream (body, counts, dropped, headers, session id)
and records the request's facts and metrics; these tests call it directly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

import orjson
import pytest
from starlette.datastructures import Headers

from proxy.chat import ChatRequest, parse_chat
from proxy.dependencies import Services
from proxy.errors import ContextLengthExceeded, SessionTurnLimit
from proxy.logs import RequestFacts
from proxy.metrics import Metrics
from proxy.pipeline.prepare import PROMPT_TOKENS, TRIMMED_MESSAGES, Prepared, limit_for, prepare
from proxy.sessions.gate import build_sessions
from proxy.tokens import ApproxCounter
from proxy.tokens.counter import TokenCounter
from proxy.types import JSONObject, Message, PromptCount
from proxy.upstream import ContextWindows, Upstream
from tests.support.inprocess import make_settings

PER_MESSAGE = 10


class TenEach:
    """Every message is 10 tokens, plus 2 of overhead: easy to reason about.

    With ``penalty``, a list whose first user message is not the conversation's
    first costs that much more, the way a template that renders by position would;
    such a counter is not additive, and the kept list must be recounted.
    """

    name = "ten-each"
    exact = True
    max_token_chars = None

    def __init__(self, penalty: int = 0) -> None:
        self.penalty = penalty
        self.additive = penalty == 0
        self.calls = 0

    async def count(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[JSONObject] | None = None,
        model: str | None = None,
    ) -> PromptCount:
        self.calls += 1
        first_user = next((m for m in messages if m["role"] == "user"), None)
        cut = first_user is not None and not str(first_user["content"]).startswith("q0")
        return PromptCount((PER_MESSAGE,) * len(messages), 2 + (self.penalty if cut else 0))

    async def count_prompt(
        self, text: str, *, model: str | None = None, special_tokens: bool = True
    ) -> int:
        """A word a token, and one for BOS."""
        self.calls += 1
        return len(text.split()) + special_tokens

    async def aclose(self) -> None:
        return None


def conversation(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for k in range(turns):
        messages.append({"role": "user", "content": f"q{k}"})
        messages.append({"role": "assistant", "content": f"a{k}"})
    messages.append({"role": "user", "content": "last"})
    return messages


def request_headers(headers: dict[str, str] | None = None) -> Headers:
    """A request's headers as the route hands them to ``prepare`` (case-insensitive)."""
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return Headers(raw=raw)


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    """Never asked: every test names its context window or no model."""
    client = Upstream(make_settings("http://127.0.0.1:9"))
    yield client
    await client.aclose()


def services(upstream: Upstream, counter: TokenCounter | None = None, **settings: Any) -> Services:
    s = make_settings("http://127.0.0.1:9", upstream_metrics_interval=0, **settings)
    metrics = Metrics()
    return Services(
        settings=s,
        metrics=metrics,
        upstream=upstream,
        windows=ContextWindows(upstream, s),
        counter=counter or TenEach(),
        sessions=build_sessions(s, metrics),
    )


async def run(
    svc: Services,
    messages: list[dict[str, Any]],
    headers: dict[str, str] | None = None,
    **body: Any,
) -> tuple[Prepared, RequestFacts, bytes]:
    raw = orjson.dumps({"model": "m", "messages": messages, **body})
    facts = RequestFacts("rid")
    prepared = await prepare(parse_chat(raw), raw, request_headers(headers), svc, facts)
    return prepared, facts, raw


def sample(svc: Services, name: str, labels: dict[str, str] | None = None) -> float:
    """The sample's value; without ``model`` in ``labels``, summed over the models."""
    wanted = (labels or {}).items()
    return sum(
        s.value
        for family in svc.metrics.registry.collect()
        for s in family.samples
        if s.name == name and wanted <= s.labels.items()
    )


async def test_nothing_to_trim_forwards_the_clients_bytes(upstream: Upstream) -> None:
    svc = services(upstream, context_window=4096)
    messages = conversation(2)
    prepared, facts, raw = await run(svc, messages, max_tokens=16)
    assert prepared.body is raw
    total = PER_MESSAGE * len(messages) + 2
    assert (prepared.received_tokens, prepared.forwarded_tokens) == (total, total)
    assert prepared.dropped == 0 and prepared.trim_reason is None
    assert prepared.budget == 4096 - 16 - 1
    assert prepared.headers == {PROMPT_TOKENS: str(total), TRIMMED_MESSAGES: "0"}
    assert prepared.session_id is None
    fields = facts.fields("POST", "/v1/chat/completions", 200, 0.0)
    assert fields["model"] == "m"
    assert fields["prompt_tokens_received"] == fields["prompt_tokens_forwarded"] == total
    assert fields["messages_dropped"] == 0
    assert sample(svc, "trimproxy_prompt_tokens_count", {"stage": "forwarded"}) == 1
    assert sample(svc, "trimproxy_trimmed_messages_total") == 0


async def test_over_the_budget_whole_turns_go_and_the_body_is_rebuilt(upstream: Upstream) -> None:
    svc = services(upstream, max_prompt_tokens=100)
    messages = conversation(10)  # 22 messages: 222 tokens
    prepared, facts, _ = await run(svc, messages, temperature=0.5)
    sent = orjson.loads(prepared.body)
    assert sent["temperature"] == 0.5  # other fields pass through
    kept = sent["messages"]
    assert kept[0] == messages[0] and kept[-1] == messages[-1] and kept[1]["role"] == "user"
    assert kept[1:] == messages[len(messages) - len(kept) + 1 :]
    assert prepared.dropped == len(messages) - len(kept) > 0
    assert prepared.forwarded_tokens == PER_MESSAGE * len(kept) + 2 <= 100
    assert prepared.trim_reason == "budget"
    assert prepared.headers[TRIMMED_MESSAGES] == str(prepared.dropped)
    assert facts.messages_dropped == prepared.dropped
    assert sample(svc, "trimproxy_trimmed_messages_total") == prepared.dropped
    assert sample(svc, "trimproxy_trimmed_tokens_total") == (
        prepared.received_tokens - prepared.forwarded_tokens
    )
    assert sample(svc, "trimproxy_trim_events_total", {"reason": "budget"}) == 1


async def budget_for(svc: Services, chat: ChatRequest) -> int | None:
    limit = await limit_for(svc, chat)
    return None if limit is None else limit.budget


async def test_the_budget_keeps_one_token_of_slack(upstream: Upstream) -> None:
    svc = services(upstream, context_window=1000, default_completion_reserve=100)
    chat = parse_chat(orjson.dumps({"messages": conversation(0)}))
    assert await budget_for(svc, chat) == 1000 - 100 - 1
    chat = parse_chat(orjson.dumps({"messages": conversation(0), "max_tokens": 998}))
    assert await budget_for(svc, chat) == 1
    chat = parse_chat(orjson.dumps({"messages": conversation(0), "max_tokens": 999}))
    with pytest.raises(ContextLengthExceeded) as err:
        await budget_for(svc, chat)
    assert err.value.param == "max_tokens"
    capped = services(upstream, context_window=1000, max_prompt_tokens=50)
    assert await budget_for(capped, replace(chat, max_tokens=10)) == 50
    assert await budget_for(services(upstream), chat) is None  # no window, no cap, no model


async def test_a_non_additive_counter_is_recounted_until_it_fits(upstream: Upstream) -> None:
    counter = TenEach(penalty=25)
    svc = services(upstream, counter, max_prompt_tokens=100)
    prepared, _, _ = await run(svc, conversation(10))
    kept = orjson.loads(prepared.body)["messages"]
    # The forwarded count is the recount of the kept list, penalty included, in budget.
    assert prepared.forwarded_tokens == PER_MESSAGE * len(kept) + 2 + 25 <= 100
    assert counter.calls >= 2


async def test_what_cannot_fit_is_refused_and_the_facts_say_so(upstream: Upstream) -> None:
    svc = services(upstream, max_prompt_tokens=15)  # system + last user = 22
    facts = RequestFacts("rid")
    raw = orjson.dumps({"model": "m", "messages": conversation(3)})
    with pytest.raises(ContextLengthExceeded):
        await prepare(parse_chat(raw), raw, request_headers(), svc, facts)
    assert facts.prompt_tokens_received == PER_MESSAGE * 8 + 2
    assert facts.prompt_tokens_forwarded is None


async def test_session_headers_and_id_come_from_the_gate(upstream: Upstream) -> None:
    svc = services(upstream, ApproxCounter(), session_max_turns=2)
    headers = {"X-Session-ID": "alice"}
    first, facts, _ = await run(svc, conversation(0), headers)
    assert first.session_id == facts.session_id == "alice"
    assert first.headers["x-trimproxy-session-id"] == "alice"
    assert first.headers["x-trimproxy-session-turn"] == "1"
    third, _, _ = await run(svc, conversation(2), headers)  # turn 3: over 2, reset
    assert third.headers.get("x-trimproxy-session-reset") == "1"
    assert orjson.loads(third.body)["messages"][1:] == [conversation(2)[-1]]


async def test_a_session_rejection_still_names_its_session(upstream: Upstream) -> None:
    svc = services(upstream, ApproxCounter(), session_max_turns=1, session_limit_action="reject")
    headers = {"X-Session-ID": "bob"}
    await run(svc, conversation(0), headers)
    facts = RequestFacts("rid")
    raw = orjson.dumps({"model": "m", "messages": conversation(1)})
    with pytest.raises(SessionTurnLimit):
        await prepare(parse_chat(raw), raw, request_headers(headers), svc, facts)
    assert facts.session_id == "bob"


async def test_a_non_additive_refusal_names_the_recounted_least(upstream: Upstream) -> None:
    # The least kept (system + last) sums to 22 but recounts to 22 + 25: over 40, the
    # refusal says 47, the tokens the upstream would see; under 50 it is forwarded.
    svc = services(upstream, TenEach(penalty=25), max_prompt_tokens=40)
    with pytest.raises(ContextLengthExceeded) as info:
        await run(svc, conversation(3))
    assert info.value.needed == 2 * PER_MESSAGE + 2 + 25
    assert "resulted in 47 tokens" in info.value.message
    prepared, _, _ = await run(services(upstream, TenEach(penalty=25), max_prompt_tokens=50),
                               conversation(3))  # fmt: skip
    assert prepared.forwarded_tokens == 47
    assert [m["content"] for m in orjson.loads(prepared.body)["messages"]] == ["Be brief.", "last"]
