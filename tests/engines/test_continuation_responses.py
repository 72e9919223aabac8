"""A streamed Responses answer outlives its engine: two simulated engines behind a real
``trimproxy serve``, the stream cut on command mid-answer, and the answer continued on
the other engine as the same response, read with the official ``openai`` SDK
(docs/architecture.md §23).

The sim's text is deterministic and its Responses route continues a final assistant
item with status ``incomplete`` from where that item's text ends (as vLLM 0.32 does),
so the whole answer is checkable to the byte.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from proxy.sim.dialect import completion_text
from tests.observability.promtext import scrape
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

SETTINGS = {"upstream_metrics_interval": 0, "tokenizer": "approx", "health_interval": 0.5}
ANSWER = 30
WHOLE = "".join(completion_text(ANSWER)).lstrip()  # the Responses route strips its first word


def client(proxy: ProxyProcess, how: str) -> openai.OpenAI:
    headers = {"x-session-id": "one", "x-sim-cut-after": "10", "x-sim-cut": how}
    return openai.OpenAI(
        base_url=proxy.url + "/v1", api_key="x", max_retries=0, default_headers=headers
    )


def stream_events(proxy: ProxyProcess, how: str, **extra: Any) -> list[Any]:
    with (
        client(proxy, how) as sdk,
        sdk.responses.stream(
            model="sim-model", input="tell me a long story", max_output_tokens=ANSWER, **extra
        ) as stream,
    ):
        return list(stream)


def continued_count(proxy: ProxyProcess, **labels: str) -> float:
    return scrape(proxy.url).value("trimproxy_answers_continued_total", **labels)


@pytest.mark.parametrize(("how", "reason"), [("close", "reset"), ("error", "error_event")])
def test_a_cut_responses_stream_is_continued_as_one_response(
    answering_sims: list[SimUpstream], how: str, reason: str
) -> None:
    with ProxyProcess(
        {**SETTINGS, "upstream_url": ",".join(s.url for s in answering_sims)}
    ) as proxy:
        events = stream_events(proxy, how)
        assert continued_count(proxy, reason=reason) == 1
        done = events[-1].response
        # The stored response (previous_response_id) is the whole, re-framed one.
        with client(proxy, how) as sdk:
            stored = sdk.responses.retrieve(done.id)
        log = proxy.logs()
    kinds = [e.type for e in events]
    for opening in ("response.created", "response.in_progress", "response.output_item.added",
                    "response.content_part.added"):  # fmt: skip
        assert kinds.count(opening) == 1, opening
    assert kinds[-1] == "response.completed" and "error" not in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert {e.item_id for e in events if hasattr(e, "item_id")} == {done.output[0].id}
    assert events[0].response.id == done.id and events[0].response.created_at == done.created_at
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == WHOLE  # no byte repeated, none lost
    assert next(e.text for e in events if e.type == "response.output_text.done") == WHOLE
    assert next(e.part.text for e in events if e.type == "response.content_part.done") == WHOLE
    item = next(e.item for e in events if e.type == "response.output_item.done")
    assert item.content[0].text == WHOLE
    assert done.output_text == WHOLE and done.max_output_tokens == ANSWER
    assert done.usage is not None and done.usage.output_tokens == ANSWER
    assert stored.output_text == WHOLE and stored.id == done.id
    assert f'"continued":"{reason}@' in log
    # The other engine got the partial answer as a final incomplete assistant item.
    resent = [r["json"] for s in answering_sims for r in s.requests("/v1/responses")
              if isinstance(r["json"].get("input"), list)]  # fmt: skip
    assert len(resent) == 1
    last = resent[0]["input"][-1]
    assert (last["role"], last["status"], last["id"]) == ("assistant", "incomplete", item.id)
    assert last["content"][0]["text"] == WHOLE[: len(last["content"][0]["text"])]
    assert resent[0]["max_output_tokens"] == ANSWER - 10


def test_the_continuation_is_said_in_an_sse_comment(answering_sims: list[SimUpstream]) -> None:
    request = {"model": "sim-model", "input": "hi", "max_output_tokens": ANSWER, "stream": True}
    headers = {"x-sim-cut-after": "10", "x-sim-cut": "close"}
    with ProxyProcess(
        {**SETTINGS, "upstream_url": ",".join(s.url for s in answering_sims)}
    ) as proxy:
        r = httpx.post(proxy.url + "/v1/responses", json=request, headers=headers, timeout=30)
    comments = [line for line in r.text.split("\n") if line.startswith(":")]
    assert len(comments) == 1 and "continued after reset on 127.0.0.1:" in comments[0]
    assert "at 10 tokens" in comments[0]


def test_attempts_zero_keeps_the_honest_error_event(answering_sims: list[SimUpstream]) -> None:
    settings = {
        **SETTINGS,
        "upstream_url": ",".join(s.url for s in answering_sims),
        "continue_attempts": 0,
    }
    with ProxyProcess(settings) as proxy:
        with pytest.raises(openai.APIError):
            stream_events(proxy, "close")
        assert continued_count(proxy) == 0
    assert sum(len(s.requests("/v1/responses")) for s in answering_sims) == 1
