"""The Responses dialect's continuation form (``proxy.pipeline.continuation_responses``): what a
broken Responses stream sent, the request that continues it, and the new engine's
events made part of the first response. Pure functions over bytes; the whole path over
HTTP is in tests/engines/test_continuation_responses.py."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.pipeline.continuation_responses import (
    ResponsesPartial,
    ResponsesReframe,
    continued_responses_body,
)


def event(kind: str, number: int, **fields: Any) -> bytes:
    data = {"type": kind, "sequence_number": number, **fields}
    return f"event: {kind}\ndata: ".encode() + orjson.dumps(data) + b"\n\n"


def opening(rid: str, mid: str, created: int) -> list[bytes]:
    response = {"id": rid, "created_at": created, "model": "m", "max_output_tokens": 50,
                "output": [], "usage": None}  # fmt: skip
    where = {"item_id": mid, "output_index": 0, "content_index": 0}
    return [
        event("response.created", 0, response=response),
        event("response.in_progress", 1, response=response),
        event("response.output_item.added", 2, output_index=0,
              item={"id": mid, "type": "message", "content": [], "status": "in_progress"}),
        event("response.content_part.added", 3, **where, part={"type": "output_text", "text": ""}),
    ]  # fmt: skip


def delta(mid: str, number: int, text: str, **extra: Any) -> bytes:
    where = {"item_id": mid, "output_index": 0, "content_index": 0}
    return event("response.output_text.delta", number, **where, delta=text, **extra)


FIRST = (
    b"".join(opening("resp_a", "msg_a", 100))
    + delta("msg_a", 4, "Once")
    + delta("msg_a", 5, " upon")
)


def test_partial_reads_the_head_item_text_and_last_number() -> None:
    part = ResponsesPartial.read(FIRST)
    assert part.head == {"id": "resp_a", "created_at": 100, "model": "m", "max_output_tokens": 50}
    assert (part.item, part.text, part.tokens, part.sequence) == ("msg_a", "Once upon", 2, 5)
    assert part.refused is None and not part.finished


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (event("response.output_item.added", 2, output_index=0,
               item={"type": "function_call", "id": "fc"}), "a function_call item begun"),
        (event("response.output_item.added", 2, output_index=0,
               item={"type": "reasoning", "id": "rs"}), "a reasoning item begun"),
        (FIRST + delta("msg_a", 6, " a", logprobs=[{"token": " a"}]), "logprobs"),
        (FIRST + event("response.output_text.done", 6, text="Once upon"),
         "response.output_text.done sent"),
        (FIRST[:-3], "cut mid-event"),
    ],
)  # fmt: skip
def test_partial_refuses_what_cannot_go_on(data: bytes, why: str) -> None:
    assert ResponsesPartial.read(data).refused == why


def test_continued_body_appends_an_incomplete_assistant_item() -> None:
    body = orjson.dumps({"model": "m", "input": "hi", "max_output_tokens": 50, "stream": True})
    sent = orjson.loads(continued_responses_body(body, ResponsesPartial.read(FIRST)) or b"")
    assert sent["input"] == [
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "message", "role": "assistant", "id": "msg_a", "status": "incomplete",
         "content": [{"type": "output_text", "text": "Once upon", "annotations": []}]},
    ]  # fmt: skip
    assert sent["max_output_tokens"] == 48
    spent = orjson.dumps({"input": "hi", "max_output_tokens": 2})
    assert continued_responses_body(spent, ResponsesPartial.read(FIRST)) is None


def test_continued_body_extends_an_incomplete_item_the_client_sent() -> None:
    own = {"type": "message", "role": "assistant", "id": "msg_0", "status": "incomplete",
           "content": [{"type": "output_text", "text": "Tale: ", "annotations": []}]}  # fmt: skip
    body = orjson.dumps({"input": [{"role": "user", "content": "hi"}, own]})
    sent = orjson.loads(continued_responses_body(body, ResponsesPartial.read(FIRST)) or b"")
    assert len(sent["input"]) == 2
    assert sent["input"][-1]["content"][0]["text"] == "Tale: Once upon"


def test_reframe_makes_the_new_stream_part_of_the_first_response() -> None:
    reframe = ResponsesReframe(ResponsesPartial.read(FIRST))
    where = {"item_id": "msg_b", "output_index": 0, "content_index": 0}
    item = {"id": "msg_b", "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": " a time", "annotations": []}]}  # fmt: skip
    usage = {"input_tokens": 12, "output_tokens": 2, "total_tokens": 14}
    response = {"id": "resp_b", "created_at": 200, "model": "m", "max_output_tokens": 48,
                "output": [item], "usage": usage, "status": "completed"}  # fmt: skip
    new = b"".join(
        [
            *opening("resp_b", "msg_b", 200),
            delta("msg_b", 4, " a"),
            delta("msg_b", 5, " time"),
            event("response.output_text.done", 6, **where, text=" a time"),
            event("response.content_part.done", 7, **where, part=item["content"][0]),
            event("response.output_item.done", 8, output_index=0, item=item),
            event("response.completed", 9, response=response),
        ]
    )
    # Fed in pieces that cut events in two.
    out = b"".join(reframe(new[i : i + 41]) for i in range(0, len(new), 41))
    events = [orjson.loads(e.split(b"data: ", 1)[1]) for e in out.split(b"\n\n")[:-1]]
    assert [e["type"] for e in events] == [
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert [e["sequence_number"] for e in events] == list(range(6, 12))
    assert {e["item_id"] for e in events if "item_id" in e} == {"msg_a"}
    whole = "Once upon a time"
    assert events[2]["text"] == events[3]["part"]["text"] == whole
    assert events[4]["item"]["id"] == "msg_a" and events[4]["item"]["content"][0]["text"] == whole
    done = events[5]["response"]
    assert (done["id"], done["created_at"], done["max_output_tokens"]) == ("resp_a", 100, 50)
    assert done["output"][0]["content"][0]["text"] == whole
    # The prompt counted once (the new engine's held the first part), both parts' tokens.
    assert done["usage"] == {"input_tokens": 10, "output_tokens": 4, "total_tokens": 14}
