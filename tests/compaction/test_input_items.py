"""``GET /v1/responses/{id}/input_items`` and ``truncation`` through a real
``trimproxy serve`` in front of the simulated engine, driven by the ``openai`` SDK."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.compaction.helpers import sent_bodies
from tests.conftest import StartProxy
from tests.support.closing import Closing
from tests.support.sim import SimUpstream

BUDGET = 300


def text(item: Any) -> str:
    content = item.model_dump(mode="json", warnings=False)["content"]
    return str(content[0]["text"])


def test_input_items_pages_the_stored_input(
    closing: Closing, proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    proxy = proxy_server(tokenizer="upstream", upstream_metrics_interval=0)
    client = closing(openai.OpenAI(base_url=proxy.api_base, api_key="key-a"))
    said = [f"message {n}" for n in range(5)]
    first = client.responses.create(
        model="sim-model", input=[{"role": "user", "content": s} for s in said[:3]]
    )
    second = client.responses.create(
        model="sim-model",
        input=[{"role": "user", "content": s} for s in said[3:]],
        previous_response_id=first.id,
    )
    listed = client.responses.input_items.list(first.id, order="asc")
    assert [text(i) for i in listed.data] == said[:3]
    assert listed.has_more is False
    raw = httpx.get(
        f"{proxy.api_base}/responses/{first.id}/input_items",
        headers={"authorization": "Bearer key-a"},
        timeout=10,
    ).json()
    assert raw["object"] == "list"
    assert raw["first_id"] == raw["data"][0]["id"] and raw["last_id"] == raw["data"][-1]["id"]
    # The second's own input (not the chain it continued), newest first by default,
    # in pages.
    page = client.responses.input_items.list(second.id, limit=1)
    assert [text(i) for i in page.data] == [said[4]]
    assert page.has_more is True
    everything = list(client.responses.input_items.list(second.id, limit=1))
    assert [text(i) for i in everything] == [said[4], said[3]]
    assert len({i.id for i in everything}) == 2
    again = client.responses.input_items.list(second.id, limit=1)
    assert [i.id for i in again.data] == [i.id for i in page.data]  # ids stable
    other = closing(openai.OpenAI(base_url=proxy.api_base, api_key="key-b"))
    with pytest.raises(openai.NotFoundError):
        other.responses.input_items.list(first.id)
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.input_items.list(first.id, limit=1000)
    assert bad.value.param == "limit"


def test_truncation_disabled_is_refused_rather_than_trimmed(
    closing: Closing, proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    proxy = proxy_server(
        tokenizer="upstream", max_prompt_tokens=BUDGET, upstream_metrics_interval=0
    )
    client = closing(openai.OpenAI(base_url=proxy.api_base, api_key="key-a"))
    long = [
        {"role": "user" if n % 2 == 0 else "assistant", "content": f"turn {n} " + "word " * 60}
        for n in range(9)
    ]
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="sim-model", input=long, truncation="disabled")  # type: ignore[call-overload]
    assert refused.value.code == "context_length_exceeded"
    assert "'truncation' is 'disabled'" in refused.value.message
    assert sim_upstream.requests("/v1/responses") == []
    # 'auto', or none: trimmed to the budget as ever.
    for truncation in ("auto", None):
        extra = {"truncation": truncation} if truncation else {}
        done = client.responses.create(model="sim-model", input=long, **extra)  # type: ignore[call-overload]
        assert done.status in ("completed", "incomplete")
    assert all(len(b["input"]) < len(long) for b in sent_bodies(sim_upstream))
    # Within the budget, 'disabled' is served.
    short = client.responses.create(model="sim-model", input="hi", truncation="disabled")
    assert short.status in ("completed", "incomplete")
