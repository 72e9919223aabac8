"""The hf counter's start-up check: each named check, made to fail, says its name and
what the counter does instead, and the counter it leaves behind is still exact."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.tokens.errors import ConfigError
from proxy.tokens.hf import HFCounter, load_tokenizer
from proxy.tokens.hf import self_check as checks
from proxy.tokens.hf.render import Rendered
from proxy.tokens.hf.self_check import CHECK_TOOLS
from tests.tokens.conversations import growing_chat
from tests.tokens.test_hf_counter import check
from tests.tokens.test_tool_call_placement import SINGLE

Built = Callable[[str], HFCounter]


@pytest.fixture
def built(template_dir: Callable[[str], Path]) -> Iterator[Built]:
    """A fresh HFCounter (not yet checked) with one of the test templates."""
    made: list[HFCounter] = []

    def build(name: str) -> HFCounter:
        path = template_dir(name)
        counter = HFCounter(load_tokenizer(str(path)), str(path))
        made.append(counter)
        return counter

    yield build
    for counter in made:
        asyncio.run(counter.aclose())


def failed(counter: HFCounter) -> set[str]:
    return {f.check.name for f in counter.failures}


def placements(counter: HFCounter) -> set[str]:
    return {p.name for t in counter._templates.values() for p in t.placements}


def test_the_checks_have_one_name_each() -> None:
    names = [c.name for c in checks.CHECKS]
    assert len(set(names)) == len(names) == 6
    assert {c.name for c in checks.SAMPLE_CHECKS} == {
        "tracked-render",
        "messages-in-place",
        "run-counts",
    }


def test_template_renders_fails_with_its_name_and_what_to_do(built: Built) -> None:
    counter = built("refuses_all")
    with pytest.raises(ConfigError) as caught:
        counter.self_check()
    message = str(caught.value)
    assert message.startswith(f"TRIMPROXY_TOKENIZER=hf:{counter.source}: ")
    assert "self check 'template-renders' failed" in message
    assert "check conversation 1: TemplateError: this template renders no chat" in message
    assert "the chat model's tokenizer files" in message


def test_messages_in_place_fails_and_the_split_is_estimated(
    built: Built, caplog: pytest.LogCaptureFixture
) -> None:
    counter = built("reversed")
    with caplog.at_level(logging.WARNING, logger="trimproxy.tokens"):
        counter.self_check()
    assert failed(counter) == {"messages-in-place"}
    assert "self check 'messages-in-place' failed (check conversation 1," in caplog.text
    assert "lies outside its tracked stretch; splitting each prompt's total" in caplog.text
    assert placements(counter) == {"estimated"}
    got = check(counter, growing_chat(5))
    assert got.overhead == 0 and min(got.per_message) > 0


def test_tracked_render_fails_and_the_split_is_estimated(
    built: Built, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tracked render that drifts from transformers' text (no real template seen
    # does): its first character off.
    counter = built("tools_default_system")
    for tools in (None, CHECK_TOOLS):
        tracked = counter._template(tools).tracked
        real = tracked.render

        def drifted(*args: Any, real: Any = real, **kwargs: Any) -> Rendered:
            rendered = real(*args, **kwargs)
            return Rendered("?" + rendered.text[1:], rendered.bounds)

        monkeypatch.setattr(tracked, "render", drifted)
    with caplog.at_level(logging.WARNING, logger="trimproxy.tokens"):
        counter.self_check()
    monkeypatch.undo()
    assert failed(counter) == {"tracked-render"}
    assert "self check 'tracked-render' failed" in caplog.text
    assert "differs from apply_chat_template's from character 0" in caplog.text
    assert placements(counter) == {"estimated"}
    check(counter, growing_chat(5))


def test_run_counts_fails_and_whole_prompts_are_encoded(
    built: Built, caplog: pytest.LogCaptureFixture
) -> None:
    # A runs counter that counts one token too many per run: the check sees it, and
    # the totals come from encoding whole prompts while it goes on miscounting.
    counter = built("tools_default_system")
    real = counter.runs._encode
    counter.runs._encode = lambda texts: [n + 1 for n in real(texts)]
    with caplog.at_level(logging.WARNING, logger="trimproxy.tokens"):
        counter.self_check()
    assert failed(counter) == {"run-counts"}
    assert "self check 'run-counts' failed" in caplog.text
    assert "tokens by added-token runs" in caplog.text
    assert "encoding whole prompts instead" in caplog.text
    assert placements(counter) == {"placed"}
    check(counter, growing_chat(5))
    check(counter, growing_chat(5), CHECK_TOOLS)


def test_placement_fails_and_requests_are_rendered_tracked(
    built: Built, caplog: pytest.LogCaptureFixture
) -> None:
    counter = built("repeats_first")
    with caplog.at_level(logging.INFO, logger="trimproxy.tokens"):
        counter.self_check()
    # The tool-call turn's conversation is not reported again: placement is off.
    assert failed(counter) == {"placement"}
    assert "self check 'placement' failed (check conversation 1" in caplog.text
    assert "not placing requests; rendering them tracked" in caplog.text
    assert placements(counter) == {"tracked"}
    check(counter, growing_chat(5))


def test_tool_call_placement_fails_and_only_tool_call_turns_are_rendered_tracked(
    built: Built, caplog: pytest.LogCaptureFixture
) -> None:
    counter = built("calls_first")
    with caplog.at_level(logging.INFO, logger="trimproxy.tokens"):
        counter.self_check()
    assert failed(counter) == {"tool-call-placement"}
    assert "self check 'tool-call-placement' failed (check conversation 2, " in caplog.text
    assert "not placing requests with a tool-call turn" in caplog.text
    assert placements(counter) == {"placed"}
    locator = counter._template(None).locators[0]
    placed = locator.placed
    check(counter, SINGLE)  # rendered tracked: the locator is not asked
    assert locator.placed == placed
    check(counter, growing_chat(5))
    assert locator.placed == placed + 1


def test_a_passing_counter_reports_nothing(built: Built, caplog: pytest.LogCaptureFixture) -> None:
    counter = built("tools_default_system")
    with caplog.at_level(logging.INFO, logger="trimproxy.tokens"):
        counter.self_check()
    assert counter.failures == () and checks.report(counter.failures) == []
    assert "self check" not in caplog.text
