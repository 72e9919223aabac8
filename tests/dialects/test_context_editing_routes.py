"""Anthropic context editing through a real proxy in front of the simulated vLLM engine,
driven by the official ``anthropic`` SDK's beta client: the edits reach the engine as
documented (and ``context_management`` never does), the answer carries
``applied_edits`` in JSON and in the stream, ``count_tokens`` counts the edited prompt,
and a bad ``context_management`` is Anthropic's 400."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import orjson
import pytest
from starlette.responses import Response

from proxy.app import create_app
from proxy.dialects.context_editing import PLACEHOLDER
from proxy.metrics import Metrics
from proxy.pipeline.context_management import WithContextManagement
from tests.support.closing import AsyncClosing
from tests.support.inprocess import make_settings
from tests.support.served import served
from tests.support.sim import SimUpstream

BETA = "context-management-2025-06-27"
ROUNDS = 8
OUTPUT = " ".join(f"line{i}" for i in range(60))
TOOLS: list[Any] = [
    {"name": name, "description": f"{name} a path", "input_schema": {"type": "object"}}
    for name in ("read_file", "memory")
]
# The sim, like vLLM without a tool parser, serves tool_choice none only.
NONE: Any = {"type": "none"}
EDIT: Any = {
    "type": "clear_tool_uses_20250919",
    "trigger": {"type": "input_tokens", "value": 500},
    "keep": {"type": "tool_uses", "value": 2},
    "exclude_tools": ["memory"],
    "clear_tool_inputs": True,
}


@pytest.fixture
async def proxy_url(sim: SimUpstream) -> AsyncIterator[str]:
    settings = make_settings(sim.url, tokenizer="upstream", upstream_metrics_interval=0)
    async with served(create_app(settings, Metrics())) as url:
        yield url


@pytest.fixture
async def client(aclosing: AsyncClosing, proxy_url: str) -> anthropic.AsyncAnthropic:
    return await aclosing(
        anthropic.AsyncAnthropic(base_url=proxy_url, api_key="unused", max_retries=0)
    )


def task() -> list[Any]:
    """A task and ``ROUNDS`` tool rounds; every fourth call is to ``memory``."""
    out: list[Any] = [{"role": "user", "content": "Fix the failing test."}]
    for i in range(ROUNDS):
        name = "memory" if i % 4 == 0 else "read_file"
        call = {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": {"path": f"f{i}"}}
        out.append({"role": "assistant", "content": [call]})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": OUTPUT}
        out.append({"role": "user", "content": [result]})
    return out


def forwarded(sim: SimUpstream) -> dict[str, Any]:
    sent: dict[str, Any] = orjson.loads(sim.requests("/v1/messages")[-1]["body"])
    return sent


def results(body: dict[str, Any]) -> list[Any]:
    return [
        block["content"]
        for m in body["messages"]
        if isinstance(m["content"], list)
        for block in m["content"]
        if block["type"] == "tool_result"
    ]


# The memory calls (0 and 4) are excluded; 6 and 7 are the two kept.
CLEARED = [PLACEHOLDER, PLACEHOLDER, PLACEHOLDER, PLACEHOLDER, PLACEHOLDER]
EXPECTED = [OUTPUT, PLACEHOLDER, PLACEHOLDER, PLACEHOLDER, OUTPUT, PLACEHOLDER, OUTPUT, OUTPUT]


async def test_the_engine_gets_the_edited_prompt_and_the_answer_says_what_was_cleared(
    client: anthropic.AsyncAnthropic, sim: SimUpstream, proxy_url: str
) -> None:
    counted = await client.beta.messages.count_tokens(
        model="sim-model", messages=task(), tools=TOOLS, betas=[BETA],
        context_management={"edits": [EDIT]},
    )  # fmt: skip
    whole = await client.beta.messages.count_tokens(model="sim-model", messages=task(), tools=TOOLS)
    assert counted.context_management is not None
    assert counted.context_management.original_input_tokens == whole.input_tokens
    assert counted.input_tokens < whole.input_tokens

    message = await client.beta.messages.create(
        model="sim-model", messages=task(), tools=TOOLS, tool_choice=NONE, max_tokens=8,
        betas=[BETA],
        context_management={"edits": [EDIT]},
    )  # fmt: skip
    sent = forwarded(sim)
    assert "context_management" not in sent
    assert results(sent) == EXPECTED
    calls = [b for m in sent["messages"][1:] for b in m["content"] if b["type"] == "tool_use"]
    assert [c["input"] for c in calls] == [
        {"path": "f0"}, {}, {}, {}, {"path": "f4"}, {}, {"path": "f6"}, {"path": "f7"},
    ]  # fmt: skip
    assert message.context_management is not None
    (applied,) = message.context_management.applied_edits
    assert applied.type == "clear_tool_uses_20250919"
    assert applied.cleared_tool_uses == 4
    assert applied.cleared_input_tokens == whole.input_tokens - counted.input_tokens
    assert message.usage.input_tokens == counted.input_tokens  # the engine's own count

    async with httpx.AsyncClient(base_url=proxy_url) as http:
        scraped = (await http.get("/metrics")).text
    kind = 'type="clear_tool_uses_20250919"'
    assert f"trimproxy_context_edits_total{{{kind}}} 1.0" in scraped
    assert f"trimproxy_context_edit_cleared_total{{{kind}}} 4.0" in scraped
    tokens = (
        f"trimproxy_context_edit_cleared_tokens_total{{{kind}}} {applied.cleared_input_tokens}.0"
    )
    assert tokens in scraped


async def test_a_stream_carries_applied_edits_on_its_message_delta(
    client: anthropic.AsyncAnthropic, sim: SimUpstream, proxy_url: str
) -> None:
    async with client.beta.messages.stream(
        model="sim-model", messages=task(), tools=TOOLS, tool_choice=NONE, max_tokens=8,
        betas=[BETA],
        context_management={"edits": [EDIT]},
    ) as stream:  # fmt: skip
        final = await stream.get_final_message()
    assert final.context_management is not None
    assert [e.type for e in final.context_management.applied_edits] == ["clear_tool_uses_20250919"]
    assert results(forwarded(sim)) == EXPECTED
    # On the wire: the message_delta event, and no other.
    body = {
        "model": "sim-model", "messages": task(), "tools": TOOLS, "tool_choice": NONE,
        "max_tokens": 8,        "stream": True, "context_management": {"edits": [EDIT]},
    }  # fmt: skip
    async with httpx.AsyncClient(base_url=proxy_url) as http:
        answer = await http.post("/v1/messages", json=body)
    events = [e for e in answer.text.split("\n\n") if e.strip()]
    carrying = [e.split("\n")[0] for e in events if "context_management" in e]
    assert carrying == ["event: message_delta"]


async def test_applied_without_the_beta_header_and_absent_without_the_field(
    client: anthropic.AsyncAnthropic, sim: SimUpstream
) -> None:
    edited = await client.messages.create(
        model="sim-model", messages=task(), tools=TOOLS, tool_choice=NONE, max_tokens=8,
        extra_body={"context_management": {"edits": [EDIT]}},
    )  # fmt: skip
    assert results(forwarded(sim)) == EXPECTED
    extra: Any = edited.model_extra
    assert extra["context_management"]["applied_edits"][0]["cleared_tool_uses"] == 4
    plain = await client.messages.create(
        model="sim-model", messages=task(), tools=TOOLS, tool_choice=NONE, max_tokens=8
    )
    assert results(forwarded(sim)) == [OUTPUT] * ROUNDS
    assert "context_management" not in (plain.model_extra or {})
    # Not over the trigger: nothing cleared, and the answer says so.
    quiet: Any = {**EDIT, "trigger": {"type": "input_tokens", "value": 100_000}}
    untouched = await client.beta.messages.create(
        model="sim-model", messages=task(), tools=TOOLS, tool_choice=NONE, max_tokens=8,
        context_management={"edits": [quiet]},
    )  # fmt: skip
    assert results(forwarded(sim)) == [OUTPUT] * ROUNDS
    assert "context_management" not in forwarded(sim)
    assert untouched.context_management is not None
    assert untouched.context_management.applied_edits == []


@pytest.mark.parametrize(
    ("edits", "words"),
    [
        ([{"type": "clear_everything"}], "'clear_everything' is not an edit"),
        ([{"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses"}}], "keep.value"),
        ([EDIT, {"type": "clear_thinking_20251015"}], "must come first"),
    ],
)
async def test_a_bad_context_management_is_anthropics_400(
    client: anthropic.AsyncAnthropic, sim: SimUpstream, edits: Any, words: str
) -> None:
    with pytest.raises(anthropic.BadRequestError) as refused:
        await client.beta.messages.create(
            model="sim-model", messages=task(), max_tokens=8, context_management={"edits": edits}
        )
    body: Any = refused.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert words in body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as counted:
        await client.beta.messages.count_tokens(
            model="sim-model", messages=task(), context_management={"edits": edits}
        )
    assert words in str(counted.value.body)
    assert sim.requests("/v1/messages") == []


async def test_the_session_counts_the_clients_turns_while_edits_change_old_ones(
    sim: SimUpstream,
) -> None:
    """Edits replayed on every request rewrite earlier messages (with keep 3, the
    second-to-last turn's call is cleared one request later); the session limits still
    see the client's one conversation: reset after every second turn, each request
    following its reset point (their prefix hashes are the client's history's, not the
    edited one's, which would lose the point: 1, 2, 1, 1, 1)."""
    settings = make_settings(sim.url, session_max_turns=2, upstream_metrics_interval=0)
    edit: Any = {**EDIT, "keep": {"type": "tool_uses", "value": 3}, "exclude_tools": []}
    history: list[Any] = []
    turns = []
    async with served(create_app(settings, Metrics())) as url, httpx.AsyncClient() as http:
        for t in range(5):
            history.append({"role": "user", "content": f"Step {t}: {OUTPUT}"})
            for r in range(2):
                use = f"toolu_{t}_{r}"
                call = {"type": "tool_use", "id": use, "name": "read_file", "input": {}}
                result = {"type": "tool_result", "tool_use_id": use, "content": OUTPUT}
                history += [
                    {"role": "assistant", "content": [call]},
                    {"role": "user", "content": [result]},
                ]
            body = {
                "model": "sim-model", "messages": history, "max_tokens": 8,
                "context_management": {"edits": [edit]},
            }  # fmt: skip
            reply = await http.post(f"{url}/v1/messages", json=body)
            assert reply.status_code == 200, reply.text
            turns.append(int(reply.headers["x-trimproxy-session-turn"]))
            history.append({"role": "assistant", "content": reply.json()["content"]})
    assert turns == [1, 2, 1, 2, 1]


class _Chunks(Response):
    """An answer that sends a stream in the chunks it is given."""

    def __init__(self, chunks: list[bytes]) -> None:
        super().__init__(status_code=200)
        self.chunks = chunks

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for chunk in self.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _relayed(chunks: list[bytes], value: Any) -> list[Any]:
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.disconnect"}

    await WithContextManagement(_Chunks(chunks), value, stream=True)({}, receive, send)
    return sent


async def test_a_message_delta_split_across_chunks_gets_the_field_once() -> None:
    """The stream's events come in chunks cut anywhere: each passes on whole, in order,
    the one ``message_delta`` with ``context_management``, every other byte as it came."""
    events = [
        b'event: message_start\ndata: {"type":"message_start","message":{}}\n\n',
        b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":'
        b'{"type":"text_delta","text":"no message_delta here"}}\n\n',
        b'event: message_delta\ndata: {"type":"message_delta","delta":{},"usage":{}}\n\n',
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
    ]
    stream = b"".join(events)
    added = b',"context_management":{"applied_edits":[]}'
    for size in (1, 7, 40, len(stream)):
        chunks = [stream[i : i + size] for i in range(0, len(stream), size)]
        sent = await _relayed(chunks, {"applied_edits": []})
        out = b"".join(m.get("body", b"") for m in sent[1:])
        carrying = [e for e in out.split(b"\n\n") if b"context_management" in e]
        assert carrying == [events[2][:-3] + added + b"}"], size
        assert out.replace(added, b"") == stream
        assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
