"""Conversations, counts and policies for the trimming property tests."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from proxy.trimming import TrimPolicy, split_turns
from proxy.types import Message, PromptCount
from tests.support.properties import examples

TEXTS = st.sampled_from(
    [
        "hello",
        "Please summarise the attached report in three bullet points.",
        "请把这段话翻译成英文，并保留专有名词。",  # noqa: RUF001 (CJK punctuation on purpose)
        "混合 mixed text 和中文 with numbers 12345",
        "x" * 300,
        "",
    ]
)


@st.composite
def contents(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["str", "parts", "none"]))
    if kind == "str":
        return draw(TEXTS)
    if kind == "parts":
        return [{"type": "text", "text": draw(TEXTS)} for _ in range(draw(st.integers(1, 3)))]
    return None


@st.composite
def tool_exchange(draw: st.DrawFn, ids: list[int]) -> list[Message]:
    """An assistant message with 1-3 (parallel) tool calls and all their results."""
    calls = []
    for _ in range(draw(st.integers(1, 3))):
        ids[0] += 1
        calls.append(
            {
                "id": f"call_{ids[0]}",
                "type": "function",
                "function": {"name": "lookup", "arguments": '{"q": "x"}'},
            }
        )
    out: list[Message] = [{"role": "assistant", "content": None, "tool_calls": calls}]
    results = [{"role": "tool", "tool_call_id": c["id"], "content": draw(TEXTS)} for c in calls]
    out.extend(draw(st.permutations(results)))
    return out


@st.composite
def turn(draw: st.DrawFn, ids: list[int], *, last: bool = False) -> list[Message]:
    messages: list[Message] = [{"role": "user", "content": draw(contents())}]
    for _ in range(draw(st.integers(0, 3))):
        step = draw(st.sampled_from(["assistant", "tools", "system"]))
        if step == "assistant":
            messages.append({"role": "assistant", "content": draw(contents())})
        elif step == "tools":
            messages.extend(draw(tool_exchange(ids)))
        else:
            messages.append({"role": "system", "content": draw(TEXTS)})
    if last and draw(st.booleans()):
        return messages[:1]
    return messages


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    ids = [0]
    head = [
        {"role": draw(st.sampled_from(["system", "developer"])), "content": draw(TEXTS)}
        for _ in range(draw(st.integers(0, 2)))
    ]
    pre: list[Message] = []
    if draw(st.integers(0, 4)) == 0:
        pre = [{"role": "assistant", "content": "How can I help?"}]
    body: list[Message] = []
    n_turns = draw(st.integers(1, 12))
    for i in range(n_turns):
        body.extend(draw(turn(ids, last=i == n_turns - 1)))
    return head + pre + body


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[Message], PromptCount, TrimPolicy]:
    messages = draw(conversations())
    per = tuple(draw(st.integers(1, 120)) for _ in messages)
    count = PromptCount(per, draw(st.integers(0, 20)))
    policy = TrimPolicy(
        budget=draw(st.integers(20, 1500)),
        target=draw(st.sampled_from([0.5, 0.6, 0.8, 1.0])),
        max_history_turns=draw(st.none() | st.integers(1, 6)),
        pin_first_user=draw(st.booleans()),
    )
    return messages, count, policy


def must_keep(messages: list[Message]) -> set[int]:
    head = split_turns(messages).head
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    tail = set(range(users[-1], len(messages))) if users else set(range(len(messages)))
    return set(range(head)) | tail


PROPS = settings(
    max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
