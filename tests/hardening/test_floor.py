"""The cheap floor (docs/architecture.md §7) is a floor: never above what the counters count.

If it were, a request that fits would be refused. Checked by property against the
tiny model's own tokenizer (``hf``) and ``approx`` on text built from words,
whitespace runs, non-Latin scripts and special-token look-alikes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.floor import floor_over, prompt_floor, size_floor
from proxy.tokens.approx import ApproxCounter
from proxy.tokens.hf import HFCounter
from proxy.trimming import split_turns
from proxy.types import Message
from tests.support.properties import examples
from tests.support.tiny_model import build_tokenizer

_pieces = st.sampled_from(
    ["lorem", "ipsum", " ", "  ", "\n", "\t", "\u4e2d\u6587", "caf\u00e9", "0123456789",
     "<|im_start|>", "<|im_end|>", "\u0301", "\ufb01", "!!!", "a" * 40, "\U0001f600"]
)  # fmt: skip
texts = st.lists(_pieces, max_size=60).map("".join)
conversations = st.lists(
    st.tuples(st.sampled_from(["system", "user", "assistant"]), texts), min_size=1, max_size=5
)


@pytest.fixture(scope="module")
def hf_counter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HFCounter]:
    spec = str(build_tokenizer(tmp_path_factory.mktemp("tiny")))
    loop = asyncio.new_event_loop()
    counter = loop.run_until_complete(HFCounter.load(spec))
    yield counter
    loop.run_until_complete(counter.aclose())
    loop.close()


def as_messages(pairs: list[tuple[str, str]]) -> list[Message]:
    return [{"role": role, "content": text} for role, text in pairs]


@settings(max_examples=examples(150), deadline=None)
@given(conversations)
def test_floor_never_exceeds_the_hf_count(
    hf_counter: HFCounter, pairs: list[tuple[str, str]]
) -> None:
    messages = as_messages(pairs)
    longest = hf_counter.max_token_chars
    assert longest is not None
    counted = asyncio.run(hf_counter.count(messages)).total
    assert prompt_floor(messages, longest) <= counted


@settings(max_examples=examples(150), deadline=None)
@given(conversations)
def test_floor_never_exceeds_the_approx_count(pairs: list[tuple[str, str]]) -> None:
    counter = ApproxCounter()
    messages = as_messages(pairs)
    longest = counter.max_token_chars
    assert longest is not None
    counted = asyncio.run(counter.count(messages)).total
    assert prompt_floor(messages, longest) <= counted


def test_floor_of_a_huge_message_is_far_over_any_window(hf_counter: HFCounter) -> None:
    longest = hf_counter.max_token_chars
    assert longest is not None
    huge: list[Message] = [{"role": "user", "content": "lorem ipsum dolor " * (6 << 16)}]
    assert prompt_floor(huge, longest) > 131072


def test_floor_counts_only_what_trimming_must_keep() -> None:
    messages: list[Message] = [
        {"role": "system", "content": "s" * 80},
        {"role": "user", "content": "old " * 10_000},
        {"role": "assistant", "content": "x" * 10_000},
        {"role": "user", "content": "q" * 160},
    ]
    assert prompt_floor(messages, 10) == (80 + 160) // 20


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["system", "developer", "user", "assistant", "tool"]), texts),
        max_size=8,
    ),
    st.integers(min_value=1, max_value=8),
)
def test_floor_keeps_what_trimming_keeps(pairs: list[tuple[str, str]], longest: int) -> None:
    # prompt_floor finds the head and the last turn from both ends; trimming's own
    # split is the definition of what is kept, whatever the roles' order.
    messages = as_messages(pairs)
    turns = split_turns(messages)
    last = turns.starts[-1] if turns.starts else turns.head
    kept = [*messages[: turns.head], *messages[last:]]
    counted = [m for m in kept if m["role"] in ("system", "developer", "user")]
    text = "".join(str(m["content"]) for m in counted)
    chars = len(text) - sum(text.count(w) for w in (" ", "\n", "\t", "\r"))
    assert prompt_floor(messages, longest) == chars // (longest * 2)


@given(st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), texts), max_size=6))
def test_no_body_is_over_its_size_floor(pairs: list[tuple[str, str]]) -> None:
    # The byte gate that skips the scan must never skip a body whose floor is over.
    messages = as_messages(pairs)
    raw = orjson.dumps({"model": "m", "messages": messages})
    for longest in (1, 4, 16):
        assert prompt_floor(messages, longest) <= size_floor(len(raw), longest)


@given(conversations, st.integers(min_value=0, max_value=200))
def test_floor_over_says_the_floor_exactly_when_it_is_over(
    pairs: list[tuple[str, str]], budget: int
) -> None:
    messages = as_messages(pairs)
    floor = prompt_floor(messages, 4)
    assert floor_over(messages, 4, budget) == (floor if floor > budget else None)
