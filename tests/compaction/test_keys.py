"""Where the compaction key comes from, through real ``trimproxy serve`` processes: the
Redis of the shared stores (every replica, and a restart, opens an item) and the
operator's summary setting (one budgeted engine call, its text sealed in the item)."""

from __future__ import annotations

from typing import Any

import openai

from tests.compaction.helpers import agent_input, dumped, sent_bodies
from tests.conftest import StartProxy
from tests.support.closing import Closing
from tests.support.redis_server import RedisServer
from tests.support.sim import SimUpstream


def _compact(client: openai.OpenAI) -> list[dict[str, Any]]:
    compacted = client.responses.compact(model="sim-model", input=agent_input(3))  # type: ignore[arg-type]
    return dumped(compacted.output)


def test_the_key_kept_in_redis_opens_items_on_every_replica_and_after_a_restart(
    closing: Closing,
    proxy_server: StartProxy,
    redis_server: RedisServer,
    sim_upstream: SimUpstream,
) -> None:
    def replica() -> openai.OpenAI:
        proxy = proxy_server(
            tokenizer="upstream", redis_url=redis_server.url, upstream_metrics_interval=0
        )
        return closing(openai.OpenAI(base_url=proxy.api_base, api_key="key-a"))

    a, b = replica(), replica()
    out = _compact(a)
    assert b.responses.create(model="sim-model", input=out).status == "completed"  # type: ignore[arg-type]
    assert replica().responses.create(model="sim-model", input=out).status == "completed"  # type: ignore[arg-type]
    assert len(sent_bodies(sim_upstream)) == 2


def test_a_summary_is_one_engine_call_sealed_in_the_item(
    closing: Closing, proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    proxy = proxy_server(
        tokenizer="upstream", compaction_summary="true", upstream_metrics_interval=0
    )
    client = closing(openai.OpenAI(base_url=proxy.api_base, api_key="key-a"))
    out = _compact(client)
    (asked,) = sent_bodies(sim_upstream)  # the summary: a request like a client's
    assert asked["store"] is False and asked["max_output_tokens"] == 512
    assert "Summarize the conversation" in asked["input"][-1]["content"]
    client.responses.create(model="sim-model", input=out)  # type: ignore[arg-type]
    sent = sent_bodies(sim_upstream)[-1]["input"]
    summary = [i for i in sent if i.get("role") == "developer" and "Summary" in i["content"]]
    assert len(summary) == 1
    assert sent.index(summary[0]) == len(agent_input(3))  # after the folded items
