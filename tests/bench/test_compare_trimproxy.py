"""trimproxy through the comparison's own harness, without the peers installed.

The bench's claims about trimproxy (no violation at any budget, prefix reuse held
between cuts) are checked here on a small scale with the approx counter, so a change
to trimming that breaks them fails the suite, not only the next bench run. The
harness's shared counter is checked too: it must be a real ``TokenCounter``.
"""

from __future__ import annotations

import pytest

from bench.compare import conversations, metrics, trimmers
from bench.compare.counting import REPLY_PRIMING, SharedCounter, approx_counter
from proxy.tokens.counter import TokenCounter

BUDGETS = (1000, 2500, 4000, 8000, 12000, 16000)


def words_counter() -> SharedCounter:
    return SharedCounter(lambda text: len(text.split()), "words")


async def test_shared_counter_is_a_token_counter_with_a_per_message_cache() -> None:
    counter = words_counter()
    assert isinstance(counter, TokenCounter)
    messages = conversations.agent(0, turns=3)
    count = await counter.count(messages)
    assert count.overhead == REPLY_PRIMING
    assert count.total == counter.prompt_tokens(messages)
    assert counter.prompt_tokens(messages) == counter.prompt_tokens_uncached(messages)
    assert counter._cache  # filled by the count above
    assert not counter.fresh()._cache


def test_shared_counter_counts_framing_name_and_tool_calls() -> None:
    counter = words_counter()
    # 3 framing + role + 2 words
    assert counter.message_tokens({"role": "user", "content": "two words"}) == 6
    # + name and its 1
    assert counter.message_tokens({"role": "user", "content": "x", "name": "bob"}) == 7
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{} 1"}}
    # 3 + role + function name + 2 argument words; content None is empty
    assert counter.message_tokens({"role": "assistant", "content": None, "tool_calls": [call]}) == 7
    assert counter.message_tokens({"role": "tool", "tool_call_id": "c", "content": "ok"}) == 6


@pytest.mark.parametrize("shape", conversations.SHAPES)
async def test_trimproxy_has_no_violation_at_any_budget(shape: str) -> None:
    counter = approx_counter()
    trimmer = trimmers.build("trimproxy", counter)
    messages = conversations.generate(shape)
    for budget in BUDGETS:
        out = await trimmer(messages, budget)
        c = metrics.check(messages, out, budget, counter.prompt_tokens)
        assert c.violations == 0, (shape, budget, c)
        # Refusing is allowed only when the system block and the last turn do not fit.
        if c.refused:
            last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
            must_keep = [m for m in messages[:last_user] if m["role"] == "system"]
            assert counter.prompt_tokens(must_keep + messages[last_user:]) > budget


async def test_trimproxy_keeps_the_prefix_where_a_sliding_window_loses_it() -> None:
    counter = approx_counter()
    requests = conversations.growing_requests(conversations.chat(0, turns=60))
    budget = 6000

    trimmer = trimmers.build("trimproxy", counter)
    ours = [await trimmer(r, budget) for r in requests]
    reuse = metrics.prefix_reuse(
        requests, ours, budget, counter.message_tokens, counter.prompt_tokens
    )

    def window(r: list[dict[str, object]]) -> list[dict[str, object]]:
        """The newest whole turns that fit, recomputed on every request."""
        kept: list[dict[str, object]] = []
        for i in range(len(r) - 1, 0, -1):
            if counter.prompt_tokens([r[0], r[i], *kept]) > budget:
                break
            kept.insert(0, r[i])
        while kept and kept[0]["role"] != "user":
            kept.pop(0)
        return [r[0], *kept]

    sliding = [window(r) for r in requests]
    base = metrics.prefix_reuse(
        requests, sliding, budget, counter.message_tokens, counter.prompt_tokens
    )
    assert reuse.stable > 0.8
    assert reuse.ceiling * 0.8 < reuse.reuse <= reuse.ceiling
    assert base.reuse < 0.5 * base.ceiling
    # The low-water mark costs fill: the held cut leaves room to grow back into.
    assert 0.6 < reuse.fill < base.fill <= 1.0
