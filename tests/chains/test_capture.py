"""Finding the response object in an answer, however the bytes are split."""

from __future__ import annotations

import orjson
import pytest

from proxy.pipeline.chain import JsonCapture, SseCapture

RESPONSE = {"id": "resp_1", "object": "response", "status": "completed", "output": [
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}
]}  # fmt: skip


def event(kind: str, **data: object) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


STREAM = b"".join([
    event("response.created", response={**RESPONSE, "status": "in_progress", "output": []}),
    event("response.output_text.delta", delta="response.completed"),  # the name in a text
    event("response.completed", response=RESPONSE),
])  # fmt: skip


@pytest.mark.parametrize("size", [1, 7, 64, len(STREAM)])
def test_the_completed_event_is_found_once_whatever_the_chunks(size: int) -> None:
    capture = SseCapture()
    found = [
        r
        for i in range(0, len(STREAM), size)
        if (r := capture.feed(STREAM[i : i + size], True)) is not None
    ]
    assert found == [RESPONSE]
    assert capture.feed(b"", False) is None


def test_a_stream_without_its_completed_event_stores_nothing() -> None:
    capture = SseCapture()
    assert capture.feed(STREAM[: STREAM.rfind(b"event: response.completed")], True) is None
    assert capture.feed(b"", False) is None


def test_a_json_answer_is_found_at_its_end() -> None:
    body = orjson.dumps(RESPONSE)
    capture = JsonCapture()
    assert capture.feed(body[:10], True) is None
    assert capture.feed(body[10:], True) is None
    assert capture.feed(b"", False) == RESPONSE


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"id": "resp_1"}', b'{"output": []}'])
def test_a_json_answer_that_is_no_response_object_stores_nothing(body: bytes) -> None:
    assert JsonCapture().feed(body, False) is None
