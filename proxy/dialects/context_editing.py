"""Anthropic's context editing on the Messages dialect (docs/dialects.md, "Context
editing"): a request's ``context_management.edits``, read and checked, then applied to
its ``messages`` before the budget trim, with what each edit cleared.

Two edits, as Anthropic documents them:

- ``clear_tool_uses_20250919``: once the prompt is over its ``trigger`` (input tokens,
  or tool uses; 100,000 input tokens unless given), the results of every tool use but
  the latest ``keep`` (3 unless given) are replaced by a placeholder, oldest first, the
  ``exclude_tools`` never; ``clear_tool_inputs`` (true, or a list of tool names) also
  empties the cleared calls' ``input``. With ``clear_at_least``, nothing is cleared
  unless that many input tokens would be.
- ``clear_thinking_20251015``: the ``thinking`` and ``redacted_thinking`` blocks of
  every assistant turn but the latest ``keep`` thinking turns (1 unless given, or
  ``"all"``). It must come before ``clear_tool_uses_20250919``.

Pure: the prompt's tokens come from the ``Count`` the caller hands in (the route's
counter over the whole prompt). Every message left alone is the client's own object;
an edited one is a copy.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from proxy.errors import InvalidRequest
from proxy.types import JSONObject

FIELD = "context_management"
EditType = Literal["clear_tool_uses_20250919", "clear_thinking_20251015"]
CLEAR_TOOL_USES: Final = "clear_tool_uses_20250919"
CLEAR_THINKING: Final = "clear_thinking_20251015"

#: What a cleared tool result holds instead. Anthropic does not publish its wording;
#: this one says what happened and what to do, and is the same on every request, so
#: the prompt's prefix stays the same from one request to the next.
PLACEHOLDER = "[Tool result cleared to save context. Call the tool again if it is needed.]"
DEFAULT_TRIGGER_TOKENS = 100_000
DEFAULT_KEEP_TOOL_USES = 3
DEFAULT_KEEP_THINKING_TURNS = 1

#: The prompt's tokens for a list of messages (system and tools as the request has them).
Count = Callable[[list[JSONObject]], Awaitable[int]]


@dataclass(frozen=True, slots=True)
class ClearToolUses:
    trigger_kind: Literal["input_tokens", "tool_uses"] = "input_tokens"
    trigger: int = DEFAULT_TRIGGER_TOKENS
    keep: int = DEFAULT_KEEP_TOOL_USES
    clear_at_least: int = 0
    exclude_tools: frozenset[str] = frozenset()
    clear_tool_inputs: bool | frozenset[str] = False
    type: EditType = CLEAR_TOOL_USES


@dataclass(frozen=True, slots=True)
class ClearThinking:
    keep: int | None = DEFAULT_KEEP_THINKING_TURNS
    """Thinking turns kept; None keeps them all."""
    type: EditType = CLEAR_THINKING


Edit = ClearToolUses | ClearThinking


@dataclass(slots=True)
class Edited:
    messages: list[JSONObject]
    applied: list[JSONObject] = field(default_factory=list)
    """Anthropic's ``applied_edits``: one entry per edit that cleared something."""
    original_tokens: int = 0
    tokens: int = 0
    """The prompt's tokens before and after the edits."""


# -- reading ``context_management`` -------------------------------------------------


def _bad(message: str) -> InvalidRequest:
    return InvalidRequest(
        f"{message} See Anthropic's context editing: context_management.edits holds "
        f"{CLEAR_THINKING} (first) and/or {CLEAR_TOOL_USES} objects.",
        param=FIELD,
    )


def parse(body: JSONObject) -> list[Edit] | None:
    """The request's edits in order; None when it has no ``context_management``."""
    value = body.get(FIELD)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad("'context_management' must be an object.")
    _no_other_keys(value, {"edits"}, "context_management")
    edits = value.get("edits")
    if edits is None:
        return []
    if not isinstance(edits, list):
        raise _bad("context_management.edits must be a list of edit objects.")
    out: list[Edit] = []
    for i, entry in enumerate(edits):
        where = f"context_management.edits[{i}]"
        if not isinstance(entry, dict):
            raise _bad(f"{where} must be an object.")
        kind = entry.get("type")
        if kind == CLEAR_TOOL_USES:
            out.append(_clear_tool_uses(entry, where))
        elif kind == CLEAR_THINKING:
            out.append(_clear_thinking(entry, where))
        else:
            raise _bad(f"{where}.type {kind!r} is not an edit this proxy applies.")
    kinds = [e.type for e in out]
    if len(set(kinds)) < len(kinds):
        raise _bad("Each edit type may appear once in context_management.edits.")
    if CLEAR_THINKING in kinds and kinds.index(CLEAR_THINKING) != 0:
        raise _bad(f"{CLEAR_THINKING} must come first in context_management.edits.")
    return out


def _no_other_keys(entry: JSONObject, allowed: set[str], where: str) -> None:
    for key in entry:
        if key not in allowed:
            raise _bad(f"{where}.{key}: extra inputs are not permitted.")


def _count(value: Any, where: str, *, minimum: int = 0) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
        return value
    raise _bad(f"{where} must be an integer of at least {minimum}.")


def _measure(value: Any, kinds: tuple[str, ...], where: str, minimum: int = 0) -> tuple[str, int]:
    """A ``{"type": kind, "value": n}`` object."""
    if not isinstance(value, dict) or value.get("type") not in kinds:
        names = " or ".join(repr(k) for k in kinds)
        raise _bad(f"{where} must be an object {{'type': {names}, 'value': <integer>}}.")
    _no_other_keys(value, {"type", "value"}, where)
    return value["type"], _count(value.get("value"), f"{where}.value", minimum=minimum)


def _names(value: Any, where: str) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(f"{where} must be a list of tool names.")
    return frozenset(value)


def _clear_tool_uses(entry: JSONObject, where: str) -> ClearToolUses:
    keys = {"type", "trigger", "keep", "clear_at_least", "exclude_tools", "clear_tool_inputs"}
    _no_other_keys(entry, keys, where)
    edit = ClearToolUses()
    if entry.get("trigger") is not None:
        kind, value = _measure(entry["trigger"], ("input_tokens", "tool_uses"), f"{where}.trigger")
        trigger_kind: Literal["input_tokens", "tool_uses"] = (
            "input_tokens" if kind == "input_tokens" else "tool_uses"
        )
        edit = ClearToolUses(trigger_kind=trigger_kind, trigger=value)
    keep, at_least = edit.keep, 0
    if entry.get("keep") is not None:
        keep = _measure(entry["keep"], ("tool_uses",), f"{where}.keep")[1]
    if entry.get("clear_at_least") is not None:
        where_at_least = f"{where}.clear_at_least"
        at_least = _measure(entry["clear_at_least"], ("input_tokens",), where_at_least)[1]
    exclude = frozenset[str]()
    if entry.get("exclude_tools") is not None:
        exclude = _names(entry["exclude_tools"], f"{where}.exclude_tools")
    inputs: bool | frozenset[str] = False
    raw_inputs = entry.get("clear_tool_inputs")
    if isinstance(raw_inputs, bool):
        inputs = raw_inputs
    elif raw_inputs is not None:
        inputs = _names(raw_inputs, f"{where}.clear_tool_inputs")
    return ClearToolUses(edit.trigger_kind, edit.trigger, keep, at_least, exclude, inputs)


def _clear_thinking(entry: JSONObject, where: str) -> ClearThinking:
    _no_other_keys(entry, {"type", "keep"}, where)
    keep = entry.get("keep")
    if keep is None:
        return ClearThinking()
    if keep == "all" or keep == {"type": "all"}:
        return ClearThinking(keep=None)
    kinds = ("thinking_turns",)
    return ClearThinking(keep=_measure(keep, kinds, f"{where}.keep", minimum=1)[1])


# -- applying them --------------------------------------------------------------------


async def apply(edits: Sequence[Edit], messages: list[JSONObject], count: Count) -> Edited:
    """``messages`` with the edits applied in order, each on the last one's result."""
    tokens = await count(messages)
    out = Edited(messages, original_tokens=tokens, tokens=tokens)
    for edit in edits:
        if isinstance(edit, ClearThinking):
            edited, cleared = clear_thinking(out.messages, edit)
            what = "cleared_thinking_turns"
        else:
            if not _triggered(edit, out.messages, out.tokens):
                continue
            edited, cleared = clear_tool_uses(out.messages, edit)
            what = "cleared_tool_uses"
        if not cleared:
            continue
        after = await count(edited)
        freed = max(0, out.tokens - after)
        if isinstance(edit, ClearToolUses) and freed < edit.clear_at_least:
            continue  # not worth breaking the prompt's cached prefix (Anthropic's rule)
        out.messages, out.tokens = edited, after
        out.applied.append({"type": edit.type, what: cleared, "cleared_input_tokens": freed})
    return out


def _triggered(edit: ClearToolUses, messages: list[JSONObject], tokens: int) -> bool:
    if edit.trigger_kind == "input_tokens":
        return tokens > edit.trigger
    return len(tool_uses(messages)) > edit.trigger


def _blocks(message: JSONObject) -> list[Any]:
    content = message.get("content")
    return content if isinstance(content, list) else []


def tool_uses(messages: Sequence[JSONObject]) -> list[tuple[int, int, JSONObject]]:
    """Every ``tool_use`` block of the assistant messages, in order: (message, block, it)."""
    return [
        (m, b, block)
        for m, message in enumerate(messages)
        if message.get("role") == "assistant"
        for b, block in enumerate(_blocks(message))
        if isinstance(block, dict) and block.get("type") == "tool_use"
    ]


def clear_tool_uses(
    messages: list[JSONObject], edit: ClearToolUses
) -> tuple[list[JSONObject], int]:
    """The messages with the results of all tool uses but the latest ``edit.keep`` (and
    the excluded tools') cleared, and how many tool uses that cleared."""
    uses = tool_uses(messages)
    older = uses[: max(0, len(uses) - edit.keep)]
    cleared = [(m, b, use) for m, b, use in older if use.get("name") not in edit.exclude_tools]
    if not cleared:
        return messages, 0
    ids = {use.get("id") for _, _, use in cleared if isinstance(use.get("id"), str)}
    inputs = edit.clear_tool_inputs
    blank = {
        (m, b)
        for m, b, use in cleared
        if inputs is True or (isinstance(inputs, frozenset) and use.get("name") in inputs)
    }
    out = list(messages)
    for m, message in enumerate(messages):
        blocks = _blocks(message)
        if message.get("role") == "assistant":
            changed = [
                {**block, "input": {}} if (m, b) in blank else block
                for b, block in enumerate(blocks)
            ]
        elif message.get("role") == "user":
            changed = [_cleared_result(block, ids) for block in blocks]
        else:
            continue
        if any(new is not old for new, old in zip(changed, blocks, strict=True)):
            out[m] = {**message, "content": changed}
    return out, len(cleared)


def _cleared_result(block: Any, ids: set[Any]) -> Any:
    if not isinstance(block, dict) or block.get("type") != "tool_result":
        return block
    if block.get("tool_use_id") not in ids or block.get("content") == PLACEHOLDER:
        return block
    return {**block, "content": PLACEHOLDER}


_THINKING = ("thinking", "redacted_thinking")


def clear_thinking(messages: list[JSONObject], edit: ClearThinking) -> tuple[list[JSONObject], int]:
    """The messages with the thinking blocks of all assistant turns but the latest
    ``edit.keep`` thinking turns removed, and how many turns that cleared. A turn is
    what a user message opens (one holding only tool results opens none): the
    assistant messages of a tool loop are one turn."""
    turns: list[list[int]] = []  # per turn, its assistant messages with thinking
    opened = False
    for m, message in enumerate(messages):
        role = message.get("role")
        if role == "user" and not _only_tool_results(message):
            opened = False
        elif role == "assistant":
            if not opened:
                turns.append([])
                opened = True
            if any(_is_thinking(b) for b in _blocks(message)):
                turns[-1].append(m)
    thinking = [t for t in turns if t]
    if edit.keep is None or len(thinking) <= edit.keep:
        return messages, 0
    cleared = thinking[: len(thinking) - edit.keep]
    out = list(messages)
    for turn in cleared:
        for m in turn:
            kept = [b for b in _blocks(messages[m]) if not _is_thinking(b)]
            out[m] = {**messages[m], "content": kept}
    return out, len(cleared)


def _is_thinking(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") in _THINKING


def _only_tool_results(message: JSONObject) -> bool:
    blocks = _blocks(message)
    return bool(blocks) and all(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in blocks
    )
