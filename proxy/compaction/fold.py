"""What a compaction item holds (docs/architecture.md §24): everything of a Responses
input but the user's messages, in the form the trim
ladder forwards: the content of old tool outputs cleared to a placeholder, the latest
``KEEP_OUTPUTS`` whole, calls (names, arguments, ids) kept, pairs whole.

``clear`` is the one function that renders the cleared form, so that the ladder's own
(docs/architecture.md §14) can take its place without touching the rest.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

from proxy.dialects.tool_outputs import RESPONSES
from proxy.ladder import placeholder, with_cleared
from proxy.tokens.approx import estimate_text
from proxy.types import JSONObject

#: What every cleared output begins with (``proxy.ladder.placeholder``).
_CLEARED = placeholder(0).split(" 0 ")[0]

#: The tool outputs at the end of a fold kept whole, as the ladder keeps its latest.
KEEP_OUTPUTS = 3

#: The roles whose messages stay with the client: OpenAI's compaction keeps the
#: user's messages and folds the rest, system and developer messages too.
KEPT_ROLES = frozenset(("user",))


def _tokens(content: Any) -> int:
    """What an output held, as the placeholder reports it: the approximate count (a
    fold has no engine's tokenizer at hand, and the figure is only told to the model)."""
    return estimate_text(content if isinstance(content, str) else json.dumps(content))


def is_kept(item: Any) -> bool:
    """Whether an input item stays with the client: a message of a kept role."""
    if isinstance(item, str):
        return True
    if not isinstance(item, dict):
        return False
    kind = item.get("type", "message")
    return kind == "message" and item.get("role") in KEPT_ROLES


def clear(items: Sequence[JSONObject], keep: int = KEEP_OUTPUTS) -> list[JSONObject]:
    """The items with every tool output's content but the latest ``keep`` cleared as the
    trim ladder clears it (``proxy.ladder.with_cleared`` over the Responses outputs of
    ``proxy.dialects.tool_outputs``); every other item is the client's own object."""
    outputs = RESPONSES.find(items)
    # One cleared before (an item compacted again) stays as it was: the same bytes,
    # so the engine's prefix cache still holds it.
    old = [i for i in outputs[: max(0, len(outputs) - keep)] if not _is_cleared(items[i])]
    counts = [0] * len(items)
    for i in old:
        counts[i] = _tokens(items[i].get("output"))
    return cast("list[JSONObject]", with_cleared(items, old, RESPONSES.clear, counts))


def _is_cleared(item: JSONObject) -> bool:
    content = item.get("output")
    return isinstance(content, str) and content.startswith(_CLEARED)


def fold(items: Sequence[Any], keep: int = KEEP_OUTPUTS) -> list[Any]:
    """What a compaction item seals: the items (any compaction item already
    expanded) in order, tool outputs cleared, ``compaction_trigger`` left out. The
    user's messages are sealed too, so that a client that drops them (it holds the
    item alone) loses nothing."""
    rest = [
        item
        for item in items
        if is_kept(item) or (isinstance(item, dict) and item.get("type") != "compaction_trigger")
    ]
    return clear(rest, keep)


def unfold(sent: Sequence[Any], sealed: Sequence[Any]) -> list[Any]:
    """The items a compaction item stands for, given what the client sent before it.

    The user's messages the client sent are its own (it may have shortened them):
    they take the places of the latest sealed ones, one for one from the end; sealed
    ones it did not send are put back; any it sent beyond the sealed come first. The
    client's other items before the item are what the item stands for: left out, as
    OpenAI lets a client drop them.
    """
    mine = [item for item in sent if is_kept(item)]
    places = [i for i, item in enumerate(sealed) if is_kept(item)]
    out = list(sealed)
    shared = min(len(mine), len(places))
    for place, item in zip(places[len(places) - shared :], mine[len(mine) - shared :], strict=True):
        out[place] = item
    return [*mine[: len(mine) - shared], *out]
