"""The pieces of a continued answer (``proxy.pipeline.continuation``): what a broken stream sent,
the request that continues it, and the new engine's events made part of the first
answer. Pure functions over bytes; the whole path over HTTP is in
tests/engines/test_continuation.py."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from proxy.pipeline.continuation import (
    REASONS,
    EngineErrorEvent,
    Partial,
    Reframe,
    SoFar,
    continued_body,
    reason_of,
)


def event(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    chunk = {
        "id": extra.pop("id", "chatcmpl-first"),
        "object": "chat.completion.chunk",
        "created": extra.pop("created", 100),
        "model": "m",
        "choices": [{"index": extra.pop("index", 0), "delta": delta,
                     "logprobs": extra.pop("logprobs", None), "finish_reason": finish}],
        **extra,
    }  # fmt: skip
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


ROLE = event({"role": "assistant", "content": ""})


def test_partial_reads_the_head_text_and_tokens() -> None:
    part = Partial.read(ROLE + event({"content": "Hello"}) + event({"content": " there"}))
    assert part.head == {"id": "chatcmpl-first", "created": 100, "model": "m"}
    assert (part.text, part.tokens, part.finished, part.refused) == ("Hello there", 2, False, None)


def test_partial_takes_the_engines_usage_count_when_it_streamed_one() -> None:
    usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    part = Partial.read(ROLE + event({"content": "ab"}, usage=usage))
    assert part.tokens == 3


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (ROLE + event({"content": "a"}, index=1), "n > 1"),
        (ROLE + event({"content": "a"}, logprobs={"content": []}), "logprobs"),
        (ROLE + event({"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}),
         "tool call begun"),
        (ROLE + event({"reasoning_content": "hm"}), "reasoning begun"),
        (ROLE + event({"content": "a"})[:-5], "cut mid-event"),
    ],
)  # fmt: skip
def test_partial_refuses_what_cannot_go_on(data: bytes, why: str) -> None:
    assert Partial.read(data).refused == why


def test_partial_knows_an_answer_that_had_ended() -> None:
    assert Partial.read(ROLE + event({"content": "a"}, "stop")).finished
    assert Partial.read(ROLE + b"data: [DONE]\n\n").finished


def test_continued_body_appends_the_partial_answer_and_what_was_left() -> None:
    body = orjson.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}
    )
    sent = orjson.loads(continued_body(body, "Hello", 20) or b"")
    assert sent["messages"][-1] == {"role": "assistant", "content": "Hello"}
    assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    assert sent["max_tokens"] == 30
    assert continued_body(body, "Hello", 50) is None  # nothing left to generate


def test_continued_body_extends_a_final_message_the_client_continues_itself() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once"}]
    body = orjson.dumps(
        {"messages": messages, "continue_final_message": True, "add_generation_prompt": False}
    )
    sent = orjson.loads(continued_body(body, " upon", 1) or b"")
    assert sent["messages"] == [messages[0], {"role": "assistant", "content": "Once upon"}]
    assert "max_tokens" not in sent


def test_reframe_makes_the_new_stream_part_of_the_first_answer() -> None:
    part = Partial.read(ROLE + event({"content": "Hello"}) + event({"content": " there"}))
    reframe = Reframe(part)
    usage = {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16}
    new = (
        event({"role": "assistant", "content": ""}, id="chatcmpl-second", created=200)
        + event({"content": " you"}, id="chatcmpl-second", created=200)
        + event({"content": "."}, "stop", id="chatcmpl-second", created=200)
        + b'data: {"id":"chatcmpl-second","created":200,"model":"m","choices":[],"usage":'
        + orjson.dumps(usage)
        + b"}\n\ndata: [DONE]\n\n"
    )
    # Fed in pieces that cut events in two.
    out = b"".join(reframe(new[i : i + 37]) for i in range(0, len(new), 37))
    events = out.split(b"\n\n")[:-1]
    assert events[-1] == b"data: [DONE]"
    chunks = [orjson.loads(e[6:]) for e in events[:-1]]
    assert {(c["id"], c["created"]) for c in chunks} == {("chatcmpl-first", 100)}
    assert all("role" not in choice["delta"] for c in chunks for choice in c["choices"])
    assert "".join(ch["delta"].get("content", "") for c in chunks for ch in c["choices"]) == (
        " you."
    )
    # The prompt counted once (the new engine's held the first part), both parts' tokens.
    assert chunks[-1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16}


def test_reframe_raises_on_the_new_engines_error_event() -> None:
    reframe = Reframe(Partial.read(ROLE))
    error = b'data: {"error": {"message": "boom", "code": 500}}\n\ndata: [DONE]\n\n'
    with pytest.raises(EngineErrorEvent) as raised:
        reframe(event({"content": "a"}) + error)
    assert b'"content":"a"' in raised.value.head
    assert raised.value.rest == error  # the event and what followed it


def test_so_far_keeps_the_chunks_and_splits_off_the_engines_error_event() -> None:
    seen: list[bytes] = []
    so_far = SoFar(seen.append)
    so_far.on_chunk(ROLE)
    error = b'data: {"error": {"message": "boom"}}\n\n'
    with pytest.raises(EngineErrorEvent) as raised:
        so_far.on_chunk(event({"content": "a"}) + error)
    assert so_far.chunks == [ROLE, event({"content": "a"})] == seen
    assert raised.value.rest == error
    # Text that names "error" inside a JSON string is escaped: no false alarm.
    so_far.on_chunk(event({"content": 'say {"error"'}))


def test_so_far_reads_a_long_answer_it_compacted_as_a_whole() -> None:
    """Past ``COMPACT`` chunks the kept events are read and let go: the same answer."""
    so_far = SoFar(None)
    data = ROLE + b"".join(event({"content": f" w{i}"}) for i in range(1000))
    for i in range(0, len(data), 100):  # chunks that cut events anywhere
        so_far.on_chunk(data[i : i + 100])
    assert len(so_far.chunks) < SoFar.COMPACT
    whole = Partial.read(data)
    part = so_far.read()
    assert (part.text, part.tokens, part.head) == (whole.text, 1000, whole.head)
    assert part.refused is None and not part.finished


def test_a_stream_broken_before_any_token_is_sent_again_as_it_was() -> None:
    body = orjson.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
    assert continued_body(body, "", 0) == body
    # The client saw no opening event: the new engine's goes through.
    reframe = Reframe(Partial.read(b""))
    assert b'"role":"assistant"' in reframe(ROLE)


def test_the_reasons_are_the_metrics_bounded_labels() -> None:
    broke = [
        aiohttp.ClientPayloadError("Response payload is not completed"),
        aiohttp.ServerDisconnectedError(),
        ConnectionResetError(),
        aiohttp.ServerTimeoutError("Timeout on reading data from socket"),
        EngineErrorEvent(b"", b""),
    ]
    assert [reason_of(e) for e in broke] == ["reset", "reset", "reset", "timeout", "error_event"]
    assert set(map(reason_of, broke)) == set(REASONS)
