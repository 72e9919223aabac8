"""Responses and Messages conversations for the dialect property tests.

Agent-shaped: tool calls with their results (parallel ones answered in any order),
reasoning, items of unknown types, a user message that arrives while a tool runs,
tool-result-only user messages, system reminders in the middle.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from proxy.trimming import TrimPolicy

TEXTS = st.sampled_from(["hi", "Summarise the report.", "请翻译", "x" * 120, ""])
Body = dict[str, Any]


def _ids(counter: list[int]) -> str:
    counter[0] += 1
    return f"id{counter[0]}"


@st.composite
def _user_item(draw: st.DrawFn) -> Body:
    if draw(st.booleans()):
        return {"role": "user", "content": draw(TEXTS)}
    parts = [{"type": "input_text", "text": draw(TEXTS)} for _ in range(draw(st.integers(1, 2)))]
    return {"type": "message", "role": "user", "content": parts}


@st.composite
def _tool_round(draw: st.DrawFn, counter: list[int]) -> list[Body]:
    out: list[Body] = []
    if draw(st.booleans()):
        out.append(
            {
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "t"}],
            }
        )
    calls = []
    for _ in range(draw(st.integers(1, 3))):
        call_id = _ids(counter)
        if draw(st.booleans()):
            calls.append(
                {"type": "function_call", "call_id": call_id, "name": "f", "arguments": "{}"}
            )
        else:
            calls.append(
                {"type": "custom_tool_call", "call_id": call_id, "name": "g", "input": "ls"}
            )
    out += calls
    outputs: list[Body] = [
        {"type": c["type"] + "_output", "call_id": c["call_id"], "output": draw(TEXTS)}
        for c in calls
    ]
    outputs = draw(st.permutations(outputs))
    if draw(st.integers(0, 3)) == 0:  # the user speaks while the tool runs
        outputs.insert(draw(st.integers(0, len(outputs) - 1)), draw(_user_item()))
    return out + outputs


@st.composite
def _responses_turn(draw: st.DrawFn, counter: list[int], last: bool) -> list[Body]:
    items = [draw(_user_item())]
    for _ in range(draw(st.integers(0, 3))):
        step = draw(st.sampled_from(["said", "tools", "reasoning", "unknown", "system"]))
        if step == "said":
            text = [{"type": "output_text", "text": draw(TEXTS), "annotations": []}]
            items.append({"type": "message", "role": "assistant", "content": text})
        elif step == "tools":
            items += draw(_tool_round(counter))
        elif step == "reasoning":
            items.append({"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]})
        elif step == "unknown":
            items.append({"type": "web_search_call", "id": _ids(counter), "status": "completed"})
        else:
            items.append({"type": "message", "role": "system", "content": "reminder"})
    return items[:1] if last and draw(st.booleans()) else items


@st.composite
def responses_bodies(draw: st.DrawFn) -> Body:
    counter = [0]
    items: list[Body] = [
        {
            "type": "message",
            "role": draw(st.sampled_from(["system", "developer"])),
            "content": "rules",
        }
        for _ in range(draw(st.integers(0, 2)))
    ]
    if draw(st.integers(0, 4)) == 0:
        items.append({"type": "message", "role": "assistant", "content": "How can I help?"})
    turns = draw(st.integers(1, 8))
    for k in range(turns):
        items += draw(_responses_turn(counter, k == turns - 1))
    body: Body = {"model": "m", "input": items, "store": draw(st.booleans())}
    if draw(st.booleans()):
        body["instructions"] = draw(TEXTS)
    return body


@st.composite
def _tool_exchange(draw: st.DrawFn, counter: list[int]) -> list[Body]:
    """An assistant message calling tools, then the user message with every result."""
    blocks: list[Body] = []
    if draw(st.booleans()):
        blocks.append({"type": "thinking", "thinking": "hmm", "signature": "s"})
    if draw(st.booleans()):
        blocks.append({"type": "text", "text": draw(TEXTS)})
    uses = [
        {"type": "tool_use", "id": _ids(counter), "name": "f", "input": {"k": draw(TEXTS)}}
        for _ in range(draw(st.integers(1, 3)))
    ]
    results: list[Body] = [
        {"type": "tool_result", "tool_use_id": u["id"], "content": draw(TEXTS)} for u in uses
    ]
    results = draw(st.permutations(results))
    if draw(st.integers(0, 3)) == 0:  # a reminder beside the results
        results.append({"type": "text", "text": "<system-reminder>"})
    return [{"role": "assistant", "content": blocks + uses}, {"role": "user", "content": results}]


@st.composite
def messages_bodies(draw: st.DrawFn) -> Body:
    """Alternating user/assistant messages, starting with a user message."""
    counter = [0]
    messages: list[Body] = []
    turns = draw(st.integers(1, 8))
    for k in range(turns):
        text = draw(TEXTS)
        messages.append({"role": "user", "content": text or [{"type": "text", "text": "q"}]})
        for _ in range(draw(st.integers(0, 2))):
            messages += draw(_tool_exchange(counter))
        if k < turns - 1 or draw(st.booleans()):
            messages.append(
                {"role": "assistant", "content": [{"type": "text", "text": draw(TEXTS)}]}
            )
    body: Body = {"model": "m", "max_tokens": 100, "messages": messages}
    system = draw(st.sampled_from([None, "You are terse.", [{"type": "text", "text": "Blocks."}]]))
    if system is not None:
        body["system"] = system
    return body


@st.composite
def trims(draw: st.DrawFn, items: int) -> tuple[list[int], int, TrimPolicy]:
    """Per-item counts, an overhead and a policy for ``items`` items."""
    per = [draw(st.integers(1, 120)) for _ in range(items)]
    policy = TrimPolicy(
        budget=draw(st.integers(20, 1500)),
        target=draw(st.sampled_from([0.5, 0.6, 1.0])),
        max_history_turns=draw(st.none() | st.integers(1, 5)),
        pin_first_user=draw(st.booleans()),
    )
    return per, draw(st.integers(0, 20)), policy
