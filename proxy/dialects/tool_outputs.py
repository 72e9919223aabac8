"""Where each dialect keeps its tool outputs, and how one is cleared (docs/architecture.md
§6, the trim ladder).

A tool output is chat's ``role: "tool"`` message, a Responses ``function_call_output``
or any other ``*_call_output`` item, a Messages user message that holds ``tool_result``
blocks. Clearing replaces the output's content with ``proxy.ladder.placeholder`` and
nothing else: the ids that pair it with its call stay, and so does every other field
and every other block of the message. The item is copied, never the client's changed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.ladder import ClearOne, placeholder, survey


@dataclass(frozen=True, slots=True)
class ToolOutputs:
    """One dialect's tool outputs: which items they are, and one cleared."""

    find: Callable[[Sequence[Any]], list[int]]
    clear: ClearOne
    content: Callable[[Any], Any]
    """What clearing replaces in an output (counted, before and after, as text)."""
    cleared: Callable[[Any, int], Any]
    """The same part once the output is cleared (``clear``'s, without the copy)."""
    in_roles: bool = False
    """The outputs are the items of role ``tool`` in the trim view (chat's: its items
    are their own roles): ``proxy.ladder.survey``, the ladder's one pass over the
    roles, finds them, and ``find`` is that."""
    field: str | None = None
    """The key whose whole value clearing replaces with one placeholder (chat's
    ``content``, a Responses ``output``): ``content`` reads it, ``cleared`` is the
    placeholder. None when clearing changes parts of the value (Messages blocks)."""


def _chat_outputs(items: Sequence[Any]) -> list[int]:
    # Every chat message is an object with a role (``proxy.dialects.chat.parse_chat``).
    return survey(items).tools


def _chat_clear(item: Any, tokens: int) -> object:
    cleared = item.copy()  # the client's keys in their order; a copy, never its dict
    cleared["content"] = placeholder(tokens)
    return cleared


def _chat_content(item: Any) -> Any:
    return item.get("content")


def placeholder_of(item: Any, tokens: int) -> Any:
    """The cleared content of an output whose whole content is one placeholder."""
    return placeholder(tokens)


def _responses_outputs(items: Sequence[Any]) -> list[int]:
    return [
        i
        for i, item in enumerate(items)
        if isinstance(item, dict)
        and isinstance(kind := item.get("type"), str)
        and kind.endswith("_call_output")
        and "output" in item
    ]


def _responses_clear(item: Any, tokens: int) -> object:
    cleared = item.copy()
    cleared["output"] = placeholder(tokens)
    return cleared


def _responses_content(item: Any) -> Any:
    return item.get("output")


def _results(item: Any) -> list[int]:
    """The positions of a Messages message's ``tool_result`` blocks."""
    if not isinstance(item, dict) or item.get("role") != "user":
        return []
    content = item.get("content")
    if not isinstance(content, list):
        return []
    return [
        j
        for j, block in enumerate(content)
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]


def _messages_outputs(items: Sequence[Any]) -> list[int]:
    return [i for i, item in enumerate(items) if _results(item)]


def _messages_clear(item: object, tokens: int) -> object:
    """Every ``tool_result`` block's content cleared (text and images alike), each with
    its share of the message's tokens by the size of what it held."""
    assert isinstance(item, dict)
    content = list(item["content"])
    results = _results(item)
    sizes = [len(repr(content[j].get("content"))) for j in results]
    whole = sum(sizes) or 1
    for j, size in zip(results, sizes, strict=True):
        content[j] = {**content[j], "content": placeholder(tokens * size // whole)}
    return {**item, "content": content}


def _messages_content(item: Any) -> Any:
    content = item["content"]
    return [content[j].get("content") for j in _results(item)]


def _messages_cleared(item: Any, tokens: int) -> Any:
    return _messages_content(_messages_clear(item, tokens))


CHAT = ToolOutputs(
    _chat_outputs, _chat_clear, _chat_content, placeholder_of, in_roles=True, field="content"
)
RESPONSES = ToolOutputs(
    _responses_outputs, _responses_clear, _responses_content, placeholder_of, field="output"
)
MESSAGES = ToolOutputs(_messages_outputs, _messages_clear, _messages_content, _messages_cleared)
