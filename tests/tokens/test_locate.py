"""Placing messages in a plain render: learned headers, refusals, the valve.

The property that matters, that a located split is the tracked one on real
templates, is in ``test_hf_counter.py`` (``test_placing_messages_in_a_plain_render_*``);
these are the rules on hand-made renderings.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from proxy.tokens.hf.locate import Locator
from proxy.tokens.hf.render import Rendered

SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "Hello there"}
REPLY = {"role": "assistant", "content": "Hi."}


def chatml(conversation: list[dict[str, Any]]) -> Rendered:
    """What a ChatML template renders, with the bounds tracking gives it."""
    text, bounds = "<s>", []
    for message in conversation:
        bounds.append(len(text))
        text += f"<|im_start|>{message['role']}\n{message['content'].strip()}<|im_end|>\n"
    bounds.append(len(text))
    return Rendered(text + "<|im_start|>assistant\n", tuple(bounds))


def learned(*conversations: list[dict[str, Any]]) -> Locator:
    locator = Locator()
    for conversation in conversations:
        locator.learn(conversation, chatml(conversation))
    for conversation in conversations:
        locator.verify(conversation, chatml(conversation))
    return locator


def test_headers_are_learned_and_messages_placed_where_tracking_puts_them() -> None:
    locator = learned([SYSTEM, USER, REPLY, USER])
    assert locator.usable
    assert locator.headers == {
        "system": "<|im_start|>system\n",
        "user": "<|im_start|>user\n",
        "assistant": "<|im_start|>assistant\n",
    }
    # Repeated texts, and one the template strips: each found after the one before.
    padded = {"role": "user", "content": "  Hello there \n"}
    conversation = [USER, REPLY, USER, REPLY, padded]
    rendered = chatml(conversation)
    headers = locator.headers_of(conversation)
    assert headers is not None
    assert locator.locate(rendered.text, conversation, headers, rendered.bounds[-1]) == (
        rendered.bounds
    )


@pytest.mark.parametrize(
    ("conversation", "why"),
    [
        ([USER, {"role": "assistant", "content": ""}, USER], "no text to search for"),
        ([USER, {"role": "assistant", "content": None}, USER], "no text to search for"),
        ([USER, {"role": "tool", "content": "42"}], "a role with no header learned"),
    ],
)
def test_what_cannot_be_placed_is_said_before_rendering(
    conversation: list[dict[str, Any]], why: str
) -> None:
    assert learned([SYSTEM, USER, REPLY, USER]).headers_of(conversation) is None, why


def test_text_the_template_changed_or_moved_is_not_placed() -> None:
    locator = learned([SYSTEM, USER, REPLY, USER])
    conversation = [USER, REPLY, USER]
    rendered = chatml(conversation)
    end = rendered.bounds[-1]
    headers = locator.headers_of(conversation)
    assert headers is not None
    # The reply rewritten by the template (reasoning stripped, say): not found.
    rewritten = rendered.text.replace("Hi.", "Hello.")
    assert locator.locate(rewritten, conversation, headers, end) is None
    # Found, but not after its role's header (moved into another message).
    moved = rendered.text.replace("<|im_start|>assistant\nHi.", "<|im_start|>assistant\n*Hi.")
    assert locator.locate(moved, conversation, headers, end) is None
    # Found only past the end of the last message: in the generation prompt.
    assert locator.locate(rendered.text, conversation, headers, end - 20) is None


def test_a_role_whose_header_depends_on_its_place_is_never_placed() -> None:
    locator = Locator()
    first = Rendered("[INST] Be brief.\n\nHello there [/INST]", (0, 0, 38))
    locator.learn([SYSTEM, USER], first)
    later = Rendered("[INST] Hello there [/INST]", (0, 26))
    locator.learn([USER], later)
    assert locator.headers["user"] is None
    assert locator.headers_of([USER]) is None


def test_one_disagreement_with_tracking_turns_the_locator_off() -> None:
    locator = learned([SYSTEM, USER, REPLY, USER])
    conversation = [USER, REPLY, USER]
    rendered = chatml(conversation)
    elsewhere = Rendered(rendered.text, (0, *rendered.bounds[1:]))  # tracking saw <s> in it
    locator.verify(conversation, elsewhere)
    assert locator.refuted and not locator.usable


def test_never_verified_means_never_used() -> None:
    locator = Locator()
    conversation = [USER, {"role": "assistant", "content": ""}, USER]
    locator.learn(conversation, chatml(conversation))
    locator.verify(conversation, chatml(conversation))  # not placeable: proves nothing
    assert locator.headers["user"] and not locator.verified and not locator.usable


def test_a_template_that_fails_most_requests_stops_being_located(
    caplog: pytest.LogCaptureFixture,
) -> None:
    locator = learned([SYSTEM, USER, REPLY, USER])
    for _ in range(100):
        locator.note(True)
    for _ in range(31):
        locator.note(False)
    assert locator.usable  # a few misses among many placed: still worth it
    locator = learned([SYSTEM, USER, REPLY, USER])
    with caplog.at_level(logging.WARNING, logger="trimproxy.tokens"):
        for _ in range(10):
            locator.note(True)
        for _ in range(32):
            locator.note(False)
    assert not locator.usable
    assert "32 of 42 requests" in caplog.text
