"""``context_length_exceeded`` worded the way OpenAI and vLLM word it, with the limit
that really binds.

The LiteLLM SDK is not installed in the test venv (it pulls in a large tree of
dependencies), so the phrase it matches is checked instead: BerriAI/litellm,
``litellm/litellm_core_utils/exception_mapping_utils.py``,
``ExceptionCheckers.is_error_str_context_window_exceeded`` lowercases the error text
and looks for ``"this model's maximum context length is"`` (among others); a match
raises ``ContextWindowExceededError``, which is what ``context_window_fallbacks``
act on.
"""

from __future__ import annotations

import re
from typing import Any

import openai
import pytest

from proxy.sim import tokenizer as tok
from tests.support.inprocess import StartApp, openai_client
from tests.support.sim import SimUpstream

CHAT = "/v1/chat/completions"
# What litellm (see above) looks for, lowercased.
LITELLM_CONTEXT_PHRASE = "this model's maximum context length is"
OPENAI_SHAPE = re.compile(
    r"^This model's maximum context length is (\d+) tokens(?: for prompts through this proxy "
    r"\(TRIMPROXY_MAX_PROMPT_TOKENS\))?\. However, your messages resulted in (at least )?(\d+) "
    r"tokens"
)


def conversation(last: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": last},
    ]


def least(messages: list[dict[str, Any]]) -> int:
    """What trimming keeps at the least: the system message and the last turn."""
    kept = [messages[0], messages[-1]]
    return tok.prompt_tokens(kept, add_generation_prompt=True)


def error_of(response: Any) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["type"] == "invalid_request_error"
    assert LITELLM_CONTEXT_PHRASE in error["message"].lower()
    return error


async def test_the_window_binds(app_proxy: StartApp, sim_upstream_factory: Any) -> None:
    sim: SimUpstream = sim_upstream_factory(max_model_len=300)
    proxy = await app_proxy(upstream=sim, tokenizer="upstream")
    messages = conversation("z" * 1200)
    r = await proxy.client.post(CHAT, json={"model": "sim-model", "messages": messages,
                                            "max_tokens": 20})  # fmt: skip
    error = error_of(r)
    match = OPENAI_SHAPE.match(error["message"])
    assert match is not None, error["message"]
    assert int(match.group(1)) == 300
    assert int(match.group(3)) == least(messages)
    assert "20 tokens of max_tokens leave 279 for the prompt" in error["message"]
    assert "fewer completion tokens" in error["message"]
    assert not sim.chat_requests()


async def test_the_default_reserve_is_named_when_no_max_tokens(
    app_proxy: StartApp, sim_upstream_factory: Any
) -> None:
    sim: SimUpstream = sim_upstream_factory(max_model_len=300)
    proxy = await app_proxy(upstream=sim, tokenizer="upstream", default_completion_reserve=100)
    r = await proxy.client.post(CHAT, json={"model": "m", "messages": conversation("z" * 1200)})
    error = error_of(r)
    assert "TRIMPROXY_DEFAULT_COMPLETION_RESERVE" in error["message"]
    assert "leave 199 for the prompt" in error["message"]


async def test_max_prompt_tokens_binds_and_max_tokens_is_not_the_advice(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(tokenizer="upstream", max_prompt_tokens=60)
    messages = conversation("z" * 400)
    r = await proxy.client.post(CHAT, json={"model": "sim-model", "messages": messages,
                                            "max_tokens": 10})  # fmt: skip
    error = error_of(r)
    match = OPENAI_SHAPE.match(error["message"])
    assert match is not None, error["message"]
    assert int(match.group(1)) == 60
    assert int(match.group(3)) == least(messages)
    assert "TRIMPROXY_MAX_PROMPT_TOKENS" in error["message"]
    assert "fewer completion tokens would not help" in error["message"]
    assert "(max_tokens)" not in error["message"]


async def test_the_cheap_floor_says_at_least(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    # approx knows its longest token: a huge last message is refused
    # before it is counted, with a lower bound.
    proxy = await app_proxy(tokenizer="approx", max_prompt_tokens=100)
    r = await proxy.client.post(CHAT, json={"messages": conversation("z" * 20_000)})
    match = OPENAI_SHAPE.match(error_of(r)["message"])
    assert match is not None and match.group(2) == "at least "
    assert 100 < int(match.group(3)) <= 20_000


async def test_max_tokens_that_leaves_no_room(
    app_proxy: StartApp, sim_upstream_factory: Any
) -> None:
    sim: SimUpstream = sim_upstream_factory(max_model_len=300)
    proxy = await app_proxy(upstream=sim, tokenizer="upstream")
    body = {"model": "m", "messages": conversation("hi"), "max_tokens": 400}
    r = await proxy.client.post(CHAT, json=body)
    error = error_of(r)
    assert error["message"].startswith(
        "This model's maximum context length is 300 tokens. However, you requested 400 "
        "completion tokens (max_tokens)"
    )
    assert error["param"] == "max_tokens"


async def test_the_openai_sdk_raises_bad_request_with_the_code(
    app_proxy: StartApp, sim_upstream_factory: Any
) -> None:
    sim: SimUpstream = sim_upstream_factory(max_model_len=300)
    proxy = await app_proxy(upstream=sim, tokenizer="upstream")
    async with openai_client(proxy) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="sim-model",
                messages=conversation("z" * 1200),  # type: ignore[arg-type]
            )
    assert caught.value.code == "context_length_exceeded"
    assert LITELLM_CONTEXT_PHRASE in str(caught.value).lower()


async def test_a_pinned_first_turn_is_not_in_the_refusal(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    # TRIMPROXY_PIN_FIRST_USER keeps the first turn while it fits; it is no part of
    # what the request needs, so the 400 names the system message and the last turn.
    proxy = await app_proxy(tokenizer="upstream", max_prompt_tokens=90, pin_first_user=True)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first " * 40},
        {"role": "assistant", "content": "noted"},
        {"role": "user", "content": "middle"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "last " * 80},
    ]
    pinned = tok.prompt_tokens([messages[0], *messages[1:3], messages[-1]],
                               add_generation_prompt=True)  # fmt: skip
    assert 90 < least(messages) < pinned
    r = await proxy.client.post(CHAT, json={"model": "sim-model", "messages": messages})
    match = OPENAI_SHAPE.match(error_of(r)["message"])
    assert match is not None
    assert (int(match.group(1)), match.group(2), int(match.group(3))) == (
        90, None, least(messages)
    )  # fmt: skip
    assert not sim_upstream.chat_requests()
    # At exactly that budget it is forwarded, the pin given up.
    fits = await app_proxy(tokenizer="upstream", max_prompt_tokens=least(messages),
                           pin_first_user=True)  # fmt: skip
    r = await fits.client.post(CHAT, json={"model": "sim-model", "messages": messages})
    assert r.status_code == 200, r.text
    assert r.headers["x-trimproxy-prompt-tokens"] == str(least(messages))
    assert r.headers["x-trimproxy-trimmed-messages"] == "4"
