"""The reservation's arithmetic: n answers, the cap, the default, growth and its release."""

from __future__ import annotations

import orjson
import pytest

from proxy.admission import AnswerWatch, EngineCache, KvAdmission, MemoryLedger, Need
from proxy.admission.allowance import (
    CAPPED_HEADER,
    allowance_for,
    capped_headers,
    with_allowance,
)
from proxy.admission.overrun import GROWTH_STEP, completion_tokens
from proxy.chat import ChatRequest, parse_chat
from proxy.errors import InvalidRequest, Overloaded
from proxy.metrics import Metrics


def chat(**fields: object) -> ChatRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_chat(orjson.dumps(body))


def test_n_answers_share_the_prompts_full_blocks() -> None:
    assert Need(1000, 100, 1).tokens() == 1100
    assert Need(1000, 100, 2).tokens() == 1200  # P + n x C
    # 1,000 = 31 full blocks of 32 + 8; each answer holds its own copy of the tail.
    assert Need(1000, 100, 2).tokens(32) == (31 + 2 * 4) * 32
    assert Need(1000, 100, 2).tokens(32, shares_prompt=False) == 2 * 35 * 32
    assert Need(1000, 100, 1).tokens(32) == Need(1000, 100, 1).tokens(32, False) == 35 * 32
    assert Need(1000, 100, 3).completion == 300


@pytest.mark.parametrize(
    ("fields", "cap", "tokens", "source", "capped"),
    [
        ({}, None, 512, "default", False),
        ({"max_tokens": 900}, None, 900, "request", False),
        ({}, 300, 300, "cap", False),
        ({"max_tokens": 200}, 300, 200, "request", False),
        ({"max_tokens": 900}, 300, 300, "cap", True),
        ({"max_completion_tokens": 900, "max_tokens": 100}, 300, 300, "cap", True),
    ],
)
def test_allowance(
    fields: dict[str, int], cap: int | None, tokens: int, source: str, capped: bool
) -> None:
    request = chat(n=3, **fields)
    allowance = allowance_for(request, cap, 512)
    assert (allowance.tokens, allowance.n, allowance.source) == (tokens, 3, source)
    assert allowance.capped is capped
    assert allowance.bounded is (source != "default")
    assert (CAPPED_HEADER in capped_headers(allowance)) is capped


def test_the_cap_is_written_where_the_engine_reads_it() -> None:
    filled = with_allowance(r := chat(), allowance_for(r, 300, 512))
    assert filled.body["max_tokens"] == 300
    newer = chat(max_completion_tokens=900, max_tokens=100)
    lowered = with_allowance(newer, allowance_for(newer, 300, 512))
    assert (lowered.body["max_completion_tokens"], lowered.body["max_tokens"]) == (300, 100)
    within = chat(max_tokens=100)
    assert with_allowance(within, allowance_for(within, 300, 512)) is within


def gate(metrics: Metrics, tokens: int = 10_000) -> KvAdmission:
    return KvAdmission(
        MemoryLedger(None), metrics, mode="fixed", fraction=1.0, timeout=0.05, fixed_tokens=tokens
    )


def reserved(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value("trimproxy_kv_reserved_tokens")


async def test_gate_charges_n_answers_and_learns_sharing_from_the_engine() -> None:
    metrics = Metrics()
    g = gate(metrics)
    need = Need(1000, 100, 2)
    held = await g.admit(need)
    assert held.charge == 2 * 1100  # until the engine says it shares the prompt
    held.release()
    g.observe_engine(EngineCache(6112, 32, shares_prompt=True))
    held = await g.admit(need)
    assert held.charge == 1200  # a fixed capacity keeps blocks of 1
    held.release()
    assert reserved(metrics) == 0


async def test_a_streamed_answer_grows_its_reservation_and_gives_it_all_back() -> None:
    metrics = Metrics()
    g = gate(metrics, tokens=1000)
    need = Need(500, 100, 1)
    held = await g.admit(need)
    watch = AnswerWatch(g, held, need, stream=True)
    # Covered: 100 tokens, the opening event and [DONE] (one token's slack at the end).
    watch.on_chunk(b"data: {}\n\n" * 102)  # the opening event + 101 tokens
    assert held.charge == 600
    watch.on_chunk(b"data: {}\n\n")  # the 102nd token
    assert held.charge == 600 + GROWTH_STEP and reserved(metrics) == 600 + GROWTH_STEP
    # Growth never waits, and makes newcomers wait: 300 would have fitted beside 600.
    with pytest.raises(Overloaded, match="KV cache had no room"):
        await g.admit(300)
    watch.on_chunk(b"data: {}\n\n" * 50 + b"data: [DONE]\n\n")  # 152 tokens in all
    watch.finish(None)
    assert metrics.registry.get_sample_value("trimproxy_admission_overrun_total") == 1
    assert metrics.registry.get_sample_value("trimproxy_admission_overrun_tokens_total") == 52
    held.release()
    assert reserved(metrics) == 0
    assert held.grow(10) == 0  # nothing grows once released
    assert (await g.admit(1000)).charge == 1000  # the whole capacity is free again


async def test_a_non_streamed_overrun_is_read_from_usage() -> None:
    metrics = Metrics()
    g = gate(metrics)
    need = Need(100, 50, 2)
    held = await g.admit(need)
    body = b'{"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":130}}'
    assert completion_tokens(body) == 130
    AnswerWatch(g, held, need, stream=False).finish(body)
    AnswerWatch(g, held, need, stream=False).finish(None)  # broke off: nothing known
    short = b'{"usage":{"prompt_tokens":100,"completion_tokens":99}}'
    AnswerWatch(g, held, need, stream=False).finish(short)
    assert metrics.registry.get_sample_value("trimproxy_admission_overrun_total") == 1
    assert metrics.registry.get_sample_value("trimproxy_admission_overrun_tokens_total") == 30
    held.release()


@pytest.mark.parametrize(
    ("value", "count"), [("2", 2), (2.0, 2), (" 3 ", 3), (True, 1), (None, 1), (3, 3)]
)
def test_n_is_read_as_the_engine_reads_it(value: object, count: int) -> None:
    """vLLM's pydantic reads ``"2"`` and ``2.0`` as 2: the reservation counts what the
    engine will run."""
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": value})
    assert parse_chat(body).n == count
    assert parse_chat(body.replace(b'"n"', b'"top_p"')).n == 1


@pytest.mark.parametrize("value", [0, -2, 1.5, "x", "2.5", [], {}])
@pytest.mark.parametrize("name", ["n", "best_of"])
def test_an_n_the_engine_would_refuse_is_the_proxys_400(value: object, name: str) -> None:
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], name: value})
    with pytest.raises(InvalidRequest) as refused:
        parse_chat(body)
    assert refused.value.param == name


def test_n_above_one_is_counted() -> None:
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 3})
    assert parse_chat(body).n == 3
