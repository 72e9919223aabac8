"""Property tests: trimming a dialect's conversation through its roles view keeps every
invariant of docs/dialects.md, and the forwarded body holds the kept items unchanged."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.dialects import messages, responses
from proxy.dialects.conversation import Conversation
from proxy.errors import ContextLengthExceeded
from proxy.trimming import TrimPolicy, split_turns, trim
from proxy.types import PromptCount
from tests.dialects.strategies import messages_bodies, responses_bodies, trims
from tests.support.properties import examples

PROPS = settings(
    max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
_CALLS = ("function_call", "custom_tool_call")


def _kept(conv: Conversation, case: tuple[list[int], int, TrimPolicy]) -> list[int] | None:
    """What trimming keeps, checked against the roles view; None when it refuses."""
    per, overhead, policy = case
    count = PromptCount(tuple(per[: len(conv.items)]), overhead)
    turns = split_turns(conv.roles)
    last = turns.starts[-1] if turns.starts else len(conv.items)
    must = set(range(turns.head)) | set(range(last, len(conv.items)))
    try:
        result = trim(conv.roles, count, policy)
    except ContextLengthExceeded:
        assert policy.budget is not None
        assert overhead + sum(count.per_message[i] for i in must) > policy.budget
        return None
    kept = list(result.kept)
    assert kept == sorted(set(kept))
    assert must <= set(kept)  # the head and the last turn
    return kept


def _same_bytes(sent: Sequence[Any], items: list[Any], kept: list[int], head: int) -> None:
    assert [orjson.dumps(x) for x in sent] == [orjson.dumps(items[i]) for i in kept if i >= head]


def _per_turn_conversion_is_additive(conv: Conversation, to_chat: Any, kept: list[int]) -> None:
    """The chat messages of the kept items are those of each kept turn converted on its
    own (nothing merges across a turn start), so per-item counts of the whole
    conversation still hold for what trimming keeps."""
    turns = split_turns(conv.roles)
    bounds = [*range(turns.head + 1), *turns.starts[1:], len(conv.items)]
    whole, _ = to_chat(conv, kept)
    pieces = []
    for a, b in pairwise(sorted(set(bounds))):
        part = [i for i in kept if a <= i < b]
        if part:
            pieces += to_chat(conv, part)[0]
    assert whole == pieces


@PROPS
@given(responses_bodies(), st.data())
def test_responses_trim_keeps_pairs_head_and_last_turn(body: dict[str, Any], data: Any) -> None:
    conv = responses.parse(orjson.dumps(body))
    kept = _kept(conv, data.draw(trims(len(conv.items))))
    if kept is None:
        return
    items = [conv.items[i] for i in kept if i >= conv.head]
    calls = {x["call_id"] for x in items if x.get("type") in _CALLS}
    outputs = {x["call_id"] for x in items if str(x.get("type")).endswith("_output")}
    assert calls == outputs  # never a call without its output, nor the other way
    forwarded = orjson.loads(responses.render(conv, kept, 64, store=False))
    assert forwarded["store"] is False and forwarded["max_output_tokens"] == 64
    assert forwarded.get("instructions") == body.get("instructions")
    _same_bytes(forwarded["input"], conv.items, kept, conv.head)
    again = responses.parse(responses.render(conv, kept, None))
    assert again.roles == [conv.roles[i] for i in kept]  # trimming is a fixed point
    _per_turn_conversion_is_additive(conv, responses.to_chat, kept)


@PROPS
@given(messages_bodies(), st.data())
def test_messages_trim_keeps_pairs_alternation_and_user_first(
    body: dict[str, Any], data: Any
) -> None:
    conv = messages.parse(orjson.dumps(body))
    kept = _kept(conv, data.draw(trims(len(conv.items))))
    if kept is None:
        return
    sent = orjson.loads(messages.render(conv, kept, None))["messages"]
    _same_bytes(sent, conv.items, kept, conv.head)
    blocks = [b for m in sent if isinstance(m["content"], list) for b in m["content"]]
    uses = {b["id"] for b in blocks if b["type"] == "tool_use"}
    results = {b["tool_use_id"] for b in blocks if b["type"] == "tool_result"}
    assert uses == results
    roles = [m["role"] for m in sent]
    assert roles[0] == "user"
    assert all(a != b for a, b in pairwise(roles))  # still alternating
    _per_turn_conversion_is_additive(conv, messages.to_chat, kept)


@PROPS
@given(messages_bodies())
def test_messages_tool_result_only_user_messages_never_open_a_turn(body: dict[str, Any]) -> None:
    conv = messages.parse(orjson.dumps(body))
    for item, role in zip(conv.items[conv.head :], conv.roles[conv.head :], strict=True):
        content = item["content"]
        only_results = isinstance(content, list) and all(
            b["type"] == "tool_result" for b in content
        )
        if role["role"] == "user":
            assert item["role"] == "user" and not only_results
