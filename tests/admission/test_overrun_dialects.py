"""The overrun watch on the Responses and Messages answers: their token events are
counted however the stream is cut into chunks, their own usage says what they held,
and a streamed Responses answer told no limit grows its reservation through a real
proxy in front of the sim (as ``ignore_eos`` runs one long on vLLM)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import orjson
import pytest

from proxy.admission import (
    CHAT_ANSWER,
    MESSAGES_ANSWER,
    RESPONSES_ANSWER,
    AnswerShape,
    AnswerWatch,
    KvAdmission,
    MemoryLedger,
    Need,
)
from proxy.metrics import Metrics
from tests.sessions.helpers import metric_value
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

RESERVE = 10


def _event(kind: str, **data: object) -> bytes:
    return f"event: {kind}\ndata: ".encode() + orjson.dumps({"type": kind, **data}) + b"\n\n"


def responses_stream(tokens: int, usage: bool = True) -> bytes:
    """A Responses stream as vLLM writes it: text deltas among events without a token."""
    head = _event("response.created") + _event("response.output_item.added")
    deltas = b"".join(_event("response.output_text.delta", delta="w") for _ in range(tokens))
    done = {"usage": {"input_tokens": 5, "output_tokens": tokens}} if usage else {}
    tail = _event("response.output_text.done", text="w" * tokens)
    return head + deltas + tail + _event("response.completed", response=done)


def messages_stream(tokens: int, usage: bool = True) -> bytes:
    """A Messages stream as vLLM writes it; ``message_delta`` carries the usage."""
    head = _event("message_start", message={"usage": {"input_tokens": 5}})
    head += _event("content_block_start", index=0)
    deltas = b"".join(
        _event("content_block_delta", delta={"type": "text_delta", "text": "w"})
        for _ in range(tokens)
    )
    end = {"usage": {"output_tokens": tokens}} if usage else {}
    tail = _event("content_block_stop") + _event("message_delta", **end)
    return head + deltas + tail + _event("message_stop")


def _gate(metrics: Metrics) -> KvAdmission:
    return KvAdmission(
        MemoryLedger(None), metrics, mode="fixed", fraction=1.0, timeout=0.05, fixed_tokens=10_000
    )


def _overrun(metrics: Metrics) -> tuple[float | None, float | None]:
    registry = metrics.registry
    return (
        registry.get_sample_value("trimproxy_admission_overrun_total"),
        registry.get_sample_value("trimproxy_admission_overrun_tokens_total"),
    )


@pytest.mark.parametrize(
    "shape", [RESPONSES_ANSWER, MESSAGES_ANSWER], ids=["responses", "messages"]
)
@pytest.mark.parametrize("size", [1, 5, 13, 4096])
@pytest.mark.parametrize("usage", [True, False], ids=["usage", "cut"])
async def test_token_events_are_counted_however_the_stream_is_cut(
    shape: AnswerShape, size: int, usage: bool
) -> None:
    metrics = Metrics()
    gate = _gate(metrics)
    reservation = await gate.admit(Need(5, RESERVE))
    watch = AnswerWatch(gate, reservation, Need(5, RESERVE), True, shape=shape)
    make = responses_stream if shape is RESPONSES_ANSWER else messages_stream
    stream = make(300, usage=usage)
    for at in range(0, len(stream), size):
        watch.on_chunk(stream[at : at + size])
    # Grown ahead of the answer: what it holds is covered while it runs.
    assert reservation.charge >= 5 + 300
    watch.finish(None)
    reservation.release()
    assert _overrun(metrics) == (1, 300 - RESERVE)


async def test_a_non_streamed_dialect_answer_is_read_by_its_usage() -> None:
    metrics = Metrics()
    gate = _gate(metrics)
    reservation = await gate.admit(Need(5, RESERVE))
    watch = AnswerWatch(gate, reservation, Need(5, RESERVE), False, shape=RESPONSES_ANSWER)
    answer = {"output": [{"text": '"output_tokens": 999'}], "usage": {"output_tokens": 42}}
    watch.finish(orjson.dumps(answer))
    reservation.release()
    assert _overrun(metrics) == (1, 42 - RESERVE)
    assert CHAT_ANSWER.every_event and not RESPONSES_ANSWER.every_event


def test_a_long_streamed_response_grows_its_reservation(
    proxy_server: Callable[..., ProxyProcess], sim_upstream: SimUpstream
) -> None:
    """A real proxy process (the in-process transport hands a stream over whole)."""
    proxy = proxy_server(tokenizer="approx", kv_admission="100000", default_completion_reserve=100)
    sim_upstream.configure(completion_tokens=600, tokens_per_second=300)

    def reserved() -> float:
        text = httpx.get(f"{proxy.url}/metrics", timeout=5).text
        return metric_value(text, "trimproxy_kv_reserved_tokens")

    body = {"model": "sim-model", "input": "hi", "store": False, "stream": True}
    first = peak = 0.0
    deltas = 0
    with httpx.stream("POST", f"{proxy.url}/v1/responses", json=body, timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line != "event: response.output_text.delta":
                continue
            deltas += 1
            if deltas == 1:
                first = reserved()
            if deltas == 400:
                peak = reserved()
    assert 100 < first < 200  # prompt + the default reserve of 100
    assert peak >= first + 300 - 1  # grown with the answer, ahead of it
    text = httpx.get(f"{proxy.url}/metrics", timeout=5).text
    assert metric_value(text, "trimproxy_kv_reserved_tokens") == 0
    assert metric_value(text, "trimproxy_admission_overrun_total") == 1
    assert metric_value(text, "trimproxy_admission_overrun_tokens_total") == 500
