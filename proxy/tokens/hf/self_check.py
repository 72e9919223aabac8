"""The hf backend's start-up check: named checks of its shortcuts against
``apply_chat_template``, on check conversations.

The conversations cover what changes how a template renders or how text tokenizes:
system prompts, tool calls with string arguments, tool results, ``content: None``,
content parts, reasoning, CJK, emoji, whitespace at the edges, and text that spells
a special token. Each is rendered by transformers and by the counter (a ``Sample``);
each check in ``SAMPLE_CHECKS`` judges one sample, ``PLACEMENT`` and
``TOOL_CALL_PLACEMENT`` judge a locator over them all, and ``TEMPLATE_RENDERS``
fails only when transformers renders none. A failure names its check and the
conversation, says what differed and what the counter does instead; only
``TEMPLATE_RENDERS`` stops the counter from loading.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from proxy.tokens.hf.locate import Locator
from proxy.tokens.hf.placement import Template
from proxy.tokens.hf.render import Rendered

CHECK_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]

CHECK_CONVERSATIONS: list[list[dict[str, Any]]] = [
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "  spaces at the edges \n\n"},
    ],
    [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Part one."},
                {"type": "text", "text": "第二部分\uff0c中文\u3002"},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
        {"role": "assistant", "content": "21 degrees 🌤"},
        {"role": "user", "content": "thanks <|im_start|> <s> [INST] not special?"},
    ],
    [
        {"role": "user", "content": "Think first."},
        {"role": "assistant", "content": "<think>\nsome reasoning\n</think>\n\nThe answer."},
        {"role": "user", "content": "And now?"},
    ],
]


@dataclass(frozen=True, slots=True)
class Sample:
    """One check conversation, rendered by transformers and by the counter."""

    label: str  # "check conversation 2 with tools"
    template: Template
    tools: list[dict[str, Any]] | None
    conversation: list[dict[str, Any]]  # as vLLM normalises it
    prepared: list[dict[str, Any]]  # as transformers hands it to the template
    text: str  # apply_chat_template's text
    tokens: int  # its length in tokens, from apply_chat_template
    tracked: Rendered | None  # the tracked render; None where it raised
    run_tokens: int  # the text's tokens, counted by added-token runs


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    #: The shortcut a failure turns off: the template's tracked render (its split is
    #: estimated), counting by runs (whole prompts are encoded), or placement (the
    #: requests are rendered tracked); "template": the counter does not load.
    shortcut: Literal["tracking", "runs", "placement", "template"]
    #: What the counter does while the check fails, or what the operator should do.
    instead: str
    #: What is wrong with one sample, or None; the locator checks judge in ``run``.
    judge: Callable[[Sample], str | None] | None = None
    level: int = logging.WARNING


@dataclass(frozen=True, slots=True)
class Failure:
    check: Check
    sample: Sample
    detail: str


def _tracked_text(sample: Sample) -> str | None:
    got = sample.tracked
    if got is None:
        return "the tracked render raised an error where apply_chat_template did not"
    if got.text != sample.text:
        at = _first_difference(got.text, sample.text)
        return f"its text differs from apply_chat_template's from character {at}"
    return None


def _first_difference(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _messages_in_place(sample: Sample) -> str | None:
    """Does each message's text (where it appears once, verbatim) lie in its own
    stretch? System messages are left out: templates move them."""
    got = sample.tracked
    if got is None or got.text != sample.text:
        return None  # tracked-render says why
    text, bounds = got.text, got.bounds
    for i, message in enumerate(sample.conversation):
        content = message.get("content")
        if message.get("role") == "system" or not isinstance(content, str):
            continue
        content = content.strip()
        if len(content) >= 8 and text.count(content) == 1:
            at = text.index(content)
            if not bounds[i] <= at < bounds[i + 1]:
                return f"message {i + 1} ({message.get('role')}) lies outside its tracked stretch"
    return None


def _run_counts(sample: Sample) -> str | None:
    if sample.run_tokens == sample.tokens:
        return None
    return f"{sample.run_tokens} tokens by added-token runs, {sample.tokens} by the tokenizer"


_ESTIMATE = "splitting each prompt's total among its messages by estimate (totals stay exact)"
TRACKED_RENDER = Check("tracked-render", "tracking", _ESTIMATE, _tracked_text)
MESSAGES_IN_PLACE = Check("messages-in-place", "tracking", _ESTIMATE, _messages_in_place)
RUN_COUNTS = Check(
    "run-counts", "runs", "encoding whole prompts instead (slower, still exact)", _run_counts
)
#: The checks that judge each sample on its own, in the order they run.
SAMPLE_CHECKS = (TRACKED_RENDER, MESSAGES_IN_PLACE, RUN_COUNTS)
_TRACKED = "rendering them tracked (as exact, the render costs about twice as much)"
PLACEMENT = Check("placement", "placement", f"not placing requests; {_TRACKED}", level=logging.INFO)
TOOL_CALL_PLACEMENT = Check(
    "tool-call-placement",
    "placement",
    f"not placing requests with a tool-call turn; {_TRACKED}",
    level=logging.INFO,
)
TEMPLATE_RENDERS = Check(
    "template-renders",
    "template",
    "check that these are the chat model's tokenizer files",
)
CHECKS = (TEMPLATE_RENDERS, *SAMPLE_CHECKS, PLACEMENT, TOOL_CALL_PLACEMENT)


def run(samples: Sequence[Sample]) -> list[Failure]:
    """Every check on the samples. Each locator learns its role headers from the
    samples whose tracked render passed, then is verified against them all."""
    failures: list[Failure] = []
    learned: list[tuple[Locator, Sample, Rendered]] = []
    for sample in samples:
        found = [
            Failure(check, sample, detail)
            for check in SAMPLE_CHECKS
            if check.judge is not None and (detail := check.judge(sample)) is not None
        ]
        failures += found
        if sample.tracked is not None and all(f.check.shortcut != "tracking" for f in found):
            locator = sample.template.locators[sample.tools is not None]
            locator.learn(sample.prepared, sample.tracked)
            learned.append((locator, sample, sample.tracked))
    for locator, sample, tracked in learned:
        failures += _verify(locator, sample, tracked)
    return failures


def _verify(locator: Locator, sample: Sample, tracked: Rendered) -> list[Failure]:
    refuted, contentless = locator.refuted, locator.contentless
    locator.verify(sample.prepared, tracked)
    out: list[Failure] = []
    if locator.refuted and not refuted:
        detail = "its messages found by their role headers lie elsewhere than tracking puts them"
        out.append(Failure(PLACEMENT, sample, detail))
    if locator.contentless is False and contentless is not False and not locator.refuted:
        detail = "a tool-call turn placed by its header alone lies elsewhere than tracking puts it"
        out.append(Failure(TOOL_CALL_PLACEMENT, sample, detail))
    return out


def report(failures: Sequence[Failure]) -> list[tuple[int, str]]:
    """One (log level, line) per failed check: its name, the conversations it
    failed on, the first one's detail, and what the counter does instead."""
    lines: list[tuple[int, str]] = []
    for check in CHECKS:
        mine = [f for f in failures if f.check is check]
        if mine:
            where = ", ".join(dict.fromkeys(f.sample.label for f in mine))
            line = f"self check {check.name!r} failed ({where}): {mine[0].detail}; {check.instead}"
            lines.append((check.level, line))
    return lines
