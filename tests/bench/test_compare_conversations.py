"""The comparison's conversation generators: deterministic, and shaped as documented.

A benchmark whose inputs drift between runs cannot be compared with itself, and one
whose "agent" shape has no parallel tool calls measures nothing about them."""

from __future__ import annotations

import hashlib
import itertools
import json
import re

import pytest

from bench.compare import conversations
from bench.compare.counting import approx_counter
from bench.compare.metrics import orphaned_tool_calls

_CJK = re.compile("[\u3040-\u30ff\u4e00-\u9fff]")


def cjk_share(text: str) -> float:
    return len(_CJK.findall(text)) / max(1, len(text))


@pytest.mark.parametrize("shape", conversations.SHAPES)
def test_same_seed_same_messages_other_seed_other_messages(shape: str) -> None:
    a = conversations.generate(shape, 0)
    assert a == conversations.generate(shape, 0)
    assert a != conversations.generate(shape, 1)


@pytest.mark.parametrize("shape", conversations.SHAPES)
def test_every_shape_is_a_valid_request(shape: str) -> None:
    messages = conversations.generate(shape)
    assert messages[0]["role"] == "system"
    assert messages[-1]["role"] == "user"
    assert orphaned_tool_calls(messages) == 0
    assert sum(m["role"] == "user" for m in messages) >= 24
    # Big enough that every budget of the sweep (up to 16000) has to trim.
    assert approx_counter().prompt_tokens(messages) > 16000


PINNED = {
    "chat": "a4ffa7625f09527a",
    "agent": "96e1b355c62c7d7c",
    "long": "ad8f9bf296fde17c",
    "cjk": "471009784749ba04",
}


@pytest.mark.parametrize("shape", conversations.SHAPES)
def test_seed_0_is_pinned_so_published_numbers_stay_reproducible(shape: str) -> None:
    # docs/comparison.md quotes numbers for seed 0. A change to a generator changes
    # them: rerun the bench, update the doc, then this pin.
    blob = json.dumps(conversations.generate(shape, 0), ensure_ascii=False).encode()
    assert hashlib.sha256(blob).hexdigest()[:16] == PINNED[shape]


def test_chat_alternates_user_and_assistant() -> None:
    roles = [m["role"] for m in conversations.chat(3, turns=10)[1:]]
    assert roles == ["user", "assistant"] * 9 + ["user"]


def test_agent_has_parallel_calls_null_content_two_system_messages_and_chinese() -> None:
    messages = conversations.agent(0)
    assert [m["role"] for m in messages[:2]] == ["system", "system"]
    calls = [m for m in messages if m.get("tool_calls")]
    assert any(len(m["tool_calls"]) >= 2 for m in calls)
    assert any(m["content"] is None for m in calls)
    # Every result directly follows its call, in the call's order.
    for i, m in enumerate(messages):
        if m.get("tool_calls"):
            ids = [c["id"] for c in m["tool_calls"]]
            results = messages[i + 1 : i + 1 + len(ids)]
            assert [r.get("tool_call_id") for r in results] == ids
    users = [m["content"] for m in messages if m["role"] == "user"]
    assert 0.15 < sum(cjk_share(u) > 0.5 for u in users) / len(users) < 0.6


def test_long_has_huge_messages_and_a_long_last_question() -> None:
    counter = approx_counter()
    messages = conversations.long(0)
    sizes = sorted(counter.message_tokens(m) for m in messages)
    assert sizes[-1] > 5000
    assert counter.message_tokens(messages[-1]) > 1000


def test_cjk_is_mostly_cjk() -> None:
    text = "".join(m["content"] for m in conversations.cjk(0))
    assert cjk_share(text) > 0.8


def test_unknown_shape_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="chat, agent, long, cjk"):
        conversations.generate("nope")


def test_growing_requests_end_on_each_user_message_and_extend_each_other() -> None:
    messages = conversations.chat(0, turns=5)
    requests = conversations.growing_requests(messages)
    assert len(requests) == 5
    assert requests[-1] == messages
    for prev, cur in itertools.pairwise(requests):
        assert cur[: len(prev)] == prev
        assert cur[-1]["role"] == "user"
