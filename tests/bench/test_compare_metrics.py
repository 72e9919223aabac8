"""The checks and metrics the comparison judges trimmers by.

Each violation checker gets an output that has the violation and one that has not;
the prefix-reuse metric gets hand-made prompt sequences whose answer is known."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest

from bench.compare import metrics
from bench.compare.metrics import NOT_RUN, Forwarded

Message = dict[str, Any]

SYS = {"role": "system", "content": "be brief"}


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def assistant(text: str | None, *calls: str) -> Message:
    m: Message = {"role": "assistant", "content": text}
    if calls:
        m["tool_calls"] = [
            {"id": c, "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
            for c in calls
        ]
    return m


def tool(call_id: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": f"result {call_id}"}


CONVERSATION = [
    SYS,
    user("one"),
    assistant(None, "c1", "c2"),
    tool("c1"),
    tool("c2"),
    assistant("done"),
    user("two"),
    assistant("ok"),
    user("three"),
]


def words(messages: Sequence[Message]) -> int:
    """A toy prompt count: one token a word, none for framing."""
    return sum(len(str(m.get("content") or "").split()) for m in messages)


# -- message identity ----------------------------------------------------------------


def test_key_ignores_serialisation_but_not_content() -> None:
    a = assistant(None, "c1")
    b = assistant("", "c1")
    b["tool_calls"][0]["function"]["arguments"] = '{ "a":1 }'  # LangChain re-serialises
    assert metrics.message_key(a) == metrics.message_key(b)
    assert metrics.message_key(user("x")) == metrics.message_key(
        {"role": "user", "content": [{"type": "text", "text": "x"}]}
    )
    assert metrics.message_key(user("abc")) != metrics.message_key(user("a..c"))
    assert metrics.message_key(tool("c1")) != metrics.message_key(tool("c2"))


def test_altered_counts_cut_merged_and_reordered_messages() -> None:
    kept = [SYS, *CONVERSATION[6:]]
    assert metrics.altered_messages(CONVERSATION, kept) == 0
    cut = [SYS, user("tw..o"), *CONVERSATION[7:]]
    assert metrics.altered_messages(CONVERSATION, cut) == 1
    merged_inp = [SYS, {"role": "system", "content": "tools"}, user("q")]
    merged_out = [{"role": "system", "content": "be brief\ntools"}, user("q")]
    assert metrics.altered_messages(merged_inp, merged_out) == 1
    swapped = [SYS, CONVERSATION[8], CONVERSATION[6]]
    assert metrics.altered_messages(CONVERSATION, swapped) == 1


# -- invariant checkers ----------------------------------------------------------------


def test_orphans_count_each_broken_call_id() -> None:
    assert metrics.orphaned_tool_calls(CONVERSATION) == 0
    no_second_result = [SYS, user("one"), assistant(None, "c1", "c2"), tool("c1")]
    assert metrics.orphaned_tool_calls(no_second_result) == 1
    results_without_call = [SYS, tool("c1"), tool("c2"), assistant("done"), user("x")]
    assert metrics.orphaned_tool_calls(results_without_call) == 2
    result_before_call = [SYS, tool("c1"), assistant(None, "c1"), user("x")]
    assert metrics.orphaned_tool_calls(result_before_call) == 2


def test_non_user_start_looks_past_the_whole_system_block() -> None:
    assert not metrics.non_user_start([SYS, SYS, user("a")])
    assert metrics.non_user_start([SYS, assistant("a"), user("b")])
    assert metrics.non_user_start([SYS, tool("c1"), user("b")])
    assert not metrics.non_user_start([SYS])


def test_system_lost_when_dropped_or_cut_not_when_merged() -> None:
    tools = {"role": "system", "content": "tool guide"}
    inp = [SYS, tools, user("q")]
    assert not metrics.system_lost(inp, inp)
    assert metrics.system_lost(inp, [SYS, user("q")])
    assert metrics.system_lost(inp, [{"role": "system", "content": "be"}, tools, user("q")])
    merged = [{"role": "system", "content": "be brief\ntool guide"}, user("q")]
    assert not metrics.system_lost(inp, merged)


def test_last_user_lost_when_missing_or_changed() -> None:
    assert not metrics.last_user_lost(CONVERSATION, [SYS, user("three")])
    assert metrics.last_user_lost(CONVERSATION, [SYS])
    assert metrics.last_user_lost(CONVERSATION, [SYS, user("thr..ee")])


def test_check_sums_up_one_output() -> None:
    out = [SYS, *CONVERSATION[6:]]
    c = metrics.check(CONVERSATION, out, budget=100, prompt_tokens=words)
    assert (c.tokens, c.violations, c.over_budget, c.passthrough) == (5, 0, False, False)

    broken = [SYS, tool("c2"), assistant("done"), user("two"), user("three")]
    c = metrics.check(CONVERSATION, broken, budget=3, prompt_tokens=words)
    assert c.over_budget and c.orphaned == 1 and c.non_user_start
    assert c.violations == 3

    same = metrics.check(CONVERSATION, list(CONVERSATION), budget=3, prompt_tokens=words)
    assert same.passthrough and same.over_budget

    refused = metrics.check(CONVERSATION, None, budget=3, prompt_tokens=words)
    assert refused.refused and refused.violations == 0


# -- prefix reuse ----------------------------------------------------------------------


def tokens_of(m: Message) -> int:
    return len(str(m.get("content") or "").split())


def prompt_of(ms: Any) -> int:
    return sum(tokens_of(m) for m in ms)


def grow(n: int) -> list[list[Message]]:
    """n requests; each adds a 10-word assistant reply and a 10-word question (all
    distinct: equal messages would rightly count as a shared prefix)."""
    msgs: list[Message] = [{"role": "system", "content": "s " * 10}, user("q0 " * 10)]
    requests = [list(msgs)]
    for k in range(1, n):
        msgs += [assistant(f"a{k} " * 10), user(f"q{k} " * 10)]
        requests.append(list(msgs))
    return requests


def test_reuse_of_an_untrimmed_conversation_is_its_ceiling() -> None:
    requests = grow(5)  # prompts of 20, 40, 60, 80, 100 words
    r = metrics.prefix_reuse(requests, requests, 10**6, tokens_of, prompt_of)
    # Each prompt reuses the whole previous one: (20+40+60+80)/(40+60+80+100).
    assert r.reuse == pytest.approx(200 / 280)
    assert r.ceiling == pytest.approx(r.reuse)
    assert r.stable == 1.0
    assert r.shares == pytest.approx((20 / 40, 40 / 60, 60 / 80, 80 / 100))
    assert r.fill == 0.0  # nothing needed trimming


def test_a_sliding_window_reuses_only_the_system_prompt() -> None:
    requests = grow(6)
    # The system prompt and the last four messages: the window slides every time.
    windows: list[Forwarded] = [r if len(r) <= 5 else [r[0], *r[-4:]] for r in requests]
    r = metrics.prefix_reuse(requests, windows, 50, tokens_of, prompt_of)
    assert r.stable == pytest.approx(1 / 5)  # only the step from 2 to 4 messages
    assert r.shares == pytest.approx((20 / 40, *(10 / 50,) * 4))  # then the system prompt
    assert r.reuse == pytest.approx(60 / 240)
    assert r.ceiling == pytest.approx(140 / 240)  # all but the two new messages
    assert r.fill == pytest.approx(1.0)


def test_a_held_cut_keeps_the_prefix_between_cuts() -> None:
    requests = grow(6)
    # Cut once at request 4 (drop the first turn) and keep that cut afterwards.
    fwd: list[Forwarded] = [r if k < 3 else [r[0], *r[3:]] for k, r in enumerate(requests)]
    r = metrics.prefix_reuse(requests, fwd, 10**6, tokens_of, prompt_of)
    assert r.stable == pytest.approx(4 / 5)
    assert r.shares[2] == pytest.approx(10 / 60)  # the cut: only the system prompt
    assert r.shares[3] == pytest.approx(60 / 80)  # then whole prompts again


def test_refused_requests_keep_the_previous_prompt_and_not_run_breaks_the_chain() -> None:
    requests = grow(4)
    fwd: list[Forwarded] = [requests[0], None, requests[2], requests[3]]
    r = metrics.prefix_reuse(requests, fwd, 10**6, tokens_of, prompt_of)
    assert len(r.shares) == 2
    assert r.shares[0] == pytest.approx(20 / 60)  # against request 1, still cached
    sampled: list[Forwarded] = [requests[0], NOT_RUN, requests[2], requests[3]]
    r = metrics.prefix_reuse(requests, sampled, 10**6, tokens_of, prompt_of)
    assert r.shares == pytest.approx((60 / 80,))


def test_quantile_is_nearest_rank_and_timing_reports_milliseconds() -> None:
    values = [0.005, 0.001, 0.002, 0.004, 0.003]
    assert metrics.quantile(values, 0.5) == 0.003
    assert metrics.quantile(values, 0.9) == 0.005
    assert math.isnan(metrics.quantile([], 0.5))
    t = metrics.timing(values, [v / 2 for v in values])
    assert t["median_ms"] == pytest.approx(3.0)
    assert t["cpu_p90_ms"] == pytest.approx(2.5)
    assert t["n"] == 5
