"""The prepare step of ``/v1/completions`` in process (``TenEach``: a word a token, and
one for BOS): counted per prompt, capped, reserved per prompt and answer, refused over
the budget per prompt."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.admission.allowance import CAPPED_HEADER
from proxy.admission.need import Need
from proxy.dialects import completions
from proxy.errors import ContextLengthExceeded, InvalidRequest
from proxy.logs import RequestFacts
from proxy.pipeline.prepare import PROMPT_TOKENS, Prepared
from proxy.pipeline.prepare_completion import prepare_completion
from proxy.upstream import Upstream
from tests.proxy.test_prepare import request_headers, sample, services, upstream

__all__ = ["upstream"]  # the fixture


async def run(svc: Any, **body: Any) -> tuple[Prepared, bytes]:
    raw = orjson.dumps({"model": "m", **body})
    prepared = await prepare_completion(
        completions.parse(raw), raw, request_headers(), svc, RequestFacts("rid")
    )
    return prepared, raw


async def test_a_text_prompt_is_counted_with_its_special_tokens(upstream: Upstream) -> None:
    svc = services(upstream, context_window=4096)
    prepared, raw = await run(svc, prompt="one two three", max_tokens=8)
    assert prepared.body is raw
    assert (prepared.received_tokens, prepared.forwarded_tokens, prepared.dropped) == (4, 4, 0)
    assert prepared.headers[PROMPT_TOKENS] == "4"
    plain, _ = await run(svc, prompt="one two three", add_special_tokens=False)
    assert plain.forwarded_tokens == 3
    assert sample(svc, "trimproxy_prompt_tokens_count", {"stage": "received"}) == 2


async def test_token_ids_count_as_they_are_and_truncation_cuts(upstream: Upstream) -> None:
    svc = services(upstream, context_window=4096)
    prepared, _ = await run(svc, prompt=[[1, 2, 3], [4, 5]])
    assert prepared.forwarded_tokens == 5
    cut, _ = await run(svc, prompt=["a b c d e f", "a"], truncate_prompt_tokens=3)
    assert cut.forwarded_tokens == 3 + 2


async def test_each_prompt_has_the_budget_and_the_reservation_sums_them(
    upstream: Upstream,
) -> None:
    # budget 20 - 8 - 1 = 11 a prompt: two prompts of 10 fit, though 20 together do not
    svc = services(upstream, context_window=20, default_completion_reserve=8)
    words = " ".join(["w"] * 9)
    prepared, _ = await run(svc, prompt=[words, words], max_tokens=8, n=3)
    assert prepared.forwarded_tokens == 20 and prepared.budget == 11
    allowance = prepared.allowance
    assert allowance is not None and (allowance.tokens, allowance.n) == (8, 6)
    need = Need(prepared.forwarded_tokens, prepared.reserve, allowance.n)
    assert need.tokens() == 20 + 6 * 8
    with pytest.raises(ContextLengthExceeded) as info:
        await run(svc, prompt=[words, words + " w w"], max_tokens=8)
    assert info.value.needed == 12 and info.value.maximum == 11
    assert info.value.param == "prompt"
    assert "raw prompt has no turns to drop" in info.value.message


async def test_the_cap_lowers_and_fills_in_max_tokens(upstream: Upstream) -> None:
    svc = services(upstream, context_window=4096, max_completion_tokens=10)
    asked, _ = await run(svc, prompt="a", max_tokens=100)
    assert orjson.loads(asked.body)["max_tokens"] == 10
    assert asked.headers[CAPPED_HEADER] == "100" and asked.reserve == 10
    # Absent, vLLM's own 16 stands, and is above the cap.
    absent, _ = await run(svc, prompt="a")
    assert orjson.loads(absent.body)["max_tokens"] == 10
    assert absent.headers[CAPPED_HEADER] == "16"
    # null lets the engine run to the window: the cap fills it in.
    unbounded, _ = await run(svc, prompt="a", max_tokens=None)
    assert orjson.loads(unbounded.body)["max_tokens"] == 10
    assert CAPPED_HEADER not in unbounded.headers
    within, raw = await run(svc, prompt="a", max_tokens=5)
    assert within.body is raw and within.reserve == 5


async def test_a_prompt_surely_too_long_is_refused_before_counting(upstream: Upstream) -> None:
    svc = services(upstream, max_prompt_tokens=50)
    svc.counter.max_token_chars = 4  # type: ignore[misc]
    with pytest.raises(ContextLengthExceeded) as info:
        await run(svc, prompt="x" * 10_000)
    assert "at least" in info.value.message
    assert svc.counter.calls == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt_embeds": "AAAA"}, "prompt_embeds"),
        ({"prompt": "a", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
        ({"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens"),
    ],
)
def test_what_cannot_be_counted_is_refused(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        completions.parse(orjson.dumps(body))
    assert info.value.param == param
