"""The three forms of compaction through a real ``trimproxy serve`` in front of the
simulated engine, driven by the official ``openai`` SDK: the item they make, sent
back, is expanded by the proxy and never reaches the engine."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.compaction.helpers import (
    TASK,
    agent_input,
    compaction_items,
    dumped,
    sent_bodies,
    types_of,
)
from tests.conftest import StartProxy
from tests.sessions.helpers import metric_value
from tests.support.closing import Closing
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

BUDGET = 3000


def start(proxy_server: StartProxy, **extra: object) -> ProxyProcess:
    return proxy_server(
        tokenizer="upstream", max_prompt_tokens=BUDGET, upstream_metrics_interval=0, **extra
    )


def test_compact_then_create_with_the_compacted_output(
    closing: Closing, proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    proxy = start(proxy_server)
    client = closing(openai.OpenAI(base_url=proxy.api_base, api_key="key-a"))
    history = agent_input(6)
    compacted = client.responses.compact(model="sim-model", input=history)  # type: ignore[arg-type]
    assert compacted.object == "response.compaction"
    out = dumped(compacted.output)
    # The user's messages, then one compaction item.
    assert types_of(out) == ["message", "compaction"]
    assert out[0]["role"] == "user"
    assert out[1]["encrypted_content"].startswith("tpc1.")
    assert TASK not in out[1]["encrypted_content"]  # opaque
    assert sim_upstream.requests("/v1/responses") == []  # no engine call
    answer = client.responses.create(
        model="sim-model",
        input=[*out, {"type": "message", "role": "user", "content": "Go on."}],  # type: ignore[list-item]
        max_output_tokens=64,
    )
    assert answer.status == "completed"
    (body,) = sent_bodies(sim_upstream)
    assert compaction_items(body) == []
    sent = body["input"]
    # Expanded: the developer message, the task, every call whole, then the new turn;
    # the old tool outputs cleared, the latest three whole.
    assert types_of(sent) == [*types_of(history), "message"]
    outputs = [i["output"] for i in sent if i["type"] == "function_call_output"]
    assert all(o.startswith("[tool output cleared by trimproxy") for o in outputs[:-3])
    assert [o[:4] for o in outputs[-3:]] == ["out3", "out4", "out5"]
    text = httpx.get(f"{proxy.url}/metrics", timeout=10).text
    assert metric_value(text, "trimproxy_compactions_total", form="endpoint") == 1
    assert metric_value(text, "trimproxy_compaction_items_total", outcome="expanded") == 1


def _compact(client: openai.OpenAI) -> list[dict[str, Any]]:
    compacted = client.responses.compact(model="sim-model", input=agent_input(4))  # type: ignore[arg-type]
    return dumped(compacted.output)


def test_a_changed_item_or_another_keys_is_a_400(
    closing: Closing, proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    proxy = start(proxy_server)
    client = closing(openai.OpenAI(base_url=proxy.api_base, api_key="key-a"))
    out = _compact(client)
    token = out[-1]["encrypted_content"]
    changed = token[:-6] + ("AAAAAA" if not token.endswith("AAAAAA") else "BBBBBB")
    tampered = [*out[:-1], {**out[-1], "encrypted_content": changed}]
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model="sim-model", input=tampered)  # type: ignore[arg-type]
    assert bad.value.code == "invalid_compaction_item"
    assert bad.value.param == "input"
    other = closing(openai.OpenAI(base_url=proxy.api_base, api_key="key-b"))
    with pytest.raises(openai.BadRequestError) as foreign:
        other.responses.create(model="sim-model", input=out)  # type: ignore[arg-type]
    assert "another API key" in foreign.value.message
    assert sim_upstream.requests("/v1/responses") == []  # neither reached the engine


def test_a_configured_key_outlives_a_restart_and_another_deployment_is_refused(
    closing: Closing, proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    key = "0" * 64
    first = start(proxy_server, compaction_key=key)
    out = _compact(closing(openai.OpenAI(base_url=first.api_base, api_key="key-a")))
    first.stop()
    again = start(proxy_server, compaction_key=key)
    client = closing(openai.OpenAI(base_url=again.api_base, api_key="key-a"))
    assert client.responses.create(model="sim-model", input=out).status == "completed"  # type: ignore[arg-type]
    elsewhere = start(proxy_server)  # a key drawn at start: another deployment
    client = closing(openai.OpenAI(base_url=elsewhere.api_base, api_key="key-a"))
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="sim-model", input=out)  # type: ignore[arg-type]
    assert "another deployment" in refused.value.message


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_compaction_trigger_answers_exactly_one_item(
    closing: Closing, proxy_server: StartProxy, sim_upstream: SimUpstream, stream: bool
) -> None:
    proxy = start(proxy_server)
    history = [*agent_input(5), {"type": "compaction_trigger"}]
    body = {"model": "sim-model", "input": history, "stream": stream, "store": False}
    got = httpx.post(f"{proxy.api_base}/responses", json=body, timeout=30)
    assert got.status_code == 200
    if stream:
        client = closing(openai.OpenAI(base_url=proxy.api_base, api_key="unused"))
        events = list(client.responses.create(**body))  # type: ignore[call-overload]
        done = [e.item for e in events if e.type == "response.output_item.done"]
        assert [e.type for e in events][-1] == "response.completed"
        response = events[-1].response
    else:
        response = openai.types.responses.Response.model_validate(got.json())
        done = response.output
    assert [i.type for i in done] == ["compaction"]
    assert [i.type for i in response.output] == ["compaction"]
    assert response.usage is not None and response.usage.input_tokens > 0
    assert sim_upstream.requests("/v1/responses") == []


def test_a_trigger_spelled_in_escapes_is_answered_too(
    proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    """JSON may spell a type in \\u escapes: the decoded type is the one read."""
    proxy = start(proxy_server)
    body = {"model": "sim-model", "input": [*agent_input(2), {"type": "TRIGGER"}], "store": False}
    raw = orjson.dumps(body).replace(b'"TRIGGER"', b'"\\u0063ompaction_trigger"')
    assert b"compaction" not in raw
    headers = {"content-type": "application/json"}
    got = httpx.post(f"{proxy.api_base}/responses", content=raw, headers=headers, timeout=30)
    assert got.status_code == 200
    assert [i["type"] for i in got.json()["output"]] == ["compaction"]
    assert sim_upstream.requests("/v1/responses") == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_context_management_past_its_threshold_puts_the_item_first(
    closing: Closing, proxy_server: StartProxy, sim_upstream: SimUpstream, stream: bool
) -> None:
    proxy = start(proxy_server)
    client = closing(openai.OpenAI(base_url=proxy.api_base, api_key="key-a"))
    history = agent_input(8)
    manage = [{"type": "compaction", "compact_threshold": 200}]
    request: dict[str, Any] = {
        "model": "sim-model",
        "input": history,
        "max_output_tokens": 64,
        "extra_body": {"context_management": manage},
    }
    if stream:
        events = list(client.responses.create(stream=True, **request))
        kinds = [e.type for e in events]
        # Where OpenAI's comes: added and done right after response.created, the
        # answer's own items after it, every sequence number in order.
        assert kinds[:3] == [
            "response.created",
            "response.output_item.added",
            "response.output_item.done",
        ]
        assert events[1].output_index == 0 and events[1].item.type == "compaction"
        message = [e for e in events if e.type == "response.output_item.added"][1]
        assert message.output_index == 1
        assert [e.sequence_number for e in events] == list(range(len(events)))
        response = events[-1].response
    else:
        response = client.responses.create(**request)
    assert [i.type for i in response.output] == ["compaction", "message"]
    (body,) = sent_bodies(sim_upstream)
    assert "context_management" not in body
    assert compaction_items(body) == []
    outputs = [i["output"] for i in body["input"] if i["type"] == "function_call_output"]
    assert sum(o.startswith("[tool output cleared") for o in outputs) == 5  # pruned
    # Under the threshold: nothing made, the input as sent.
    sim_upstream.clear()
    manage[0]["compact_threshold"] = 100_000
    plain = client.responses.create(**{**request, "stream": False})
    assert [i.type for i in plain.output] == ["message"]
    assert sent_bodies(sim_upstream)[0]["input"] == history
