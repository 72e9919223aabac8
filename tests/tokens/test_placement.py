"""Each ``Placement`` behind the one interface renders the text transformers renders,
and splits all of its tokens among the messages; placed and tracked split alike."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given

from proxy.tokens.hf import HFCounter
from proxy.tokens.hf.normalize import to_conversation
from proxy.tokens.hf.placement import Estimated, Placed, Placement, Tracked
from tests.tokens.conversations import TOOLS, conversations, growing_chat
from tests.tokens.test_hf_counter import FAST

NAMES = ["tools_default_system", "think_strip", "sliced_system", "tiny"]


@pytest.fixture
def fresh(
    template_dir: Callable[[str], Path], tiny_dir: Path, hf_counter: Callable[[Path], HFCounter]
) -> Iterator[Callable[[str], HFCounter]]:
    """A checked counter of its own (its locators' tallies are this test's), on the
    session's loaded tokenizer."""
    made: list[HFCounter] = []

    def build(name: str) -> HFCounter:
        path = tiny_dir if name == "tiny" else template_dir(name)
        counter = HFCounter(hf_counter(path)._tok, str(path))
        counter.self_check()
        made.append(counter)
        return counter

    yield build
    for counter in made:
        asyncio.run(counter.aclose())


def each_placement(counter: HFCounter, tools: Any) -> dict[str, Placement]:
    template = counter._template(tools)
    locator = template.locators[tools is not None]
    return {
        "placed": Placed(template.tracked, locator),
        "tracked": Tracked(template.tracked),
        "estimated": Estimated(counter._tok),
    }


def split_by(
    counter: HFCounter, placement: Placement, messages: list[Any], tools: Any
) -> tuple[str, list[int], int]:
    template = counter._template(tools)
    conversation, _ = to_conversation(messages, template.format)
    rendered = placement.render(counter._prepare(conversation), tools)
    pieces = counter.runs.spans_sync(rendered.text)
    per, overhead = placement.split(pieces, rendered, messages)
    return rendered.text, per, overhead


@pytest.mark.parametrize("name", NAMES)
def test_every_placement_renders_the_reference_text_and_splits_all_of_it(
    name: str, fresh: Callable[[str], HFCounter]
) -> None:
    counter = fresh(name)
    tools = TOOLS if name == "tools_default_system" else None
    kinds = each_placement(counter, tools)

    @FAST
    @given(conversations(tools=tools is not None, parts=False))
    def run(messages: list[Any]) -> None:
        conversation, _ = to_conversation(messages, counter._template(tools).format)
        apply = counter._tok.apply_chat_template
        want = apply(conversation, tools=tools, add_generation_prompt=True, tokenize=False)
        ids = apply(conversation, tools=tools, add_generation_prompt=True, return_dict=False)
        counter._template(tools).locators[tools is not None].missed = 0  # no valve here
        splits = {}
        for kind, placement in kinds.items():
            text, per, overhead = split_by(counter, placement, messages, tools)
            assert text == want, kind
            assert len(per) == len(messages) and min(per) >= 0 and overhead >= 0, kind
            assert sum(per) + overhead == len(ids), kind
            splits[kind] = (per, overhead)
        assert splits["placed"] == splits["tracked"]
        assert splits["estimated"][1] == 0  # an estimate has no overhead to tell apart

    run()
    assert counter._template(tools).locators[tools is not None].placed > 0  # not all tracked


def test_the_check_chooses_placed_where_a_locator_is_proven_else_tracked(
    template_dir: Callable[[str], Path], hf_counter: Callable[[Path], HFCounter]
) -> None:
    located = hf_counter(template_dir("tools_default_system"))
    assert [p.name for p in located._template(None).placements] == ["placed", "placed"]
    # Loops over content parts: no text to search for, never proven.
    parts = hf_counter(template_dir("content_parts"))
    assert [p.name for p in parts._template(None).placements] == ["tracked", "tracked"]


def test_placed_renders_tracked_what_it_cannot_place(
    fresh: Callable[[str], HFCounter],
) -> None:
    counter = fresh("think_strip")
    template = counter._template(None)
    locator = template.locators[0]
    placed, tracked = Placed(template.tracked, locator), Tracked(template.tracked)
    before = (locator.placed, locator.missed)
    chat = growing_chat(4)
    assert split_by(counter, placed, chat, None) == split_by(counter, tracked, chat, None)
    assert (locator.placed, locator.missed) == (before[0] + 1, before[1])
    # Reasoning in the history, which the template strips: not where its text says.
    thought = {"role": "assistant", "content": "<think>\nhidden\n</think>\n\nshown"}
    history = [chat[0], thought, *chat[2:]]
    assert split_by(counter, placed, history, None) == split_by(counter, tracked, history, None)
    assert (locator.placed, locator.missed) == (before[0] + 1, before[1] + 1)


def test_estimated_splits_by_each_messages_estimate(
    template_dir: Callable[[str], Path], hf_counter: Callable[[Path], HFCounter]
) -> None:
    counter = hf_counter(template_dir("think_strip"))
    short = {"role": "user", "content": "hi"}
    long = {"role": "user", "content": "a much longer question about tokens " * 20}
    _, per, overhead = split_by(counter, Estimated(counter._tok), [short, long], None)
    assert per[1] > 10 * per[0] > 0 and overhead == 0
