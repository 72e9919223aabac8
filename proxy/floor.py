"""A floor on a prompt's token count from its length alone, before any tokenizer runs.

No token covers more characters than the vocabulary's longest entry
(``max_token_chars`` on the counters that know it), so a text of ``c`` characters
is at least ``c / max_token_chars`` tokens. Only what trimming must keep is
counted (the leading system/developer block and the last turn, docs/architecture.md §6,
invariants 2 and 3), and of that only the text of system, developer and user
messages, without whitespace: chat templates may strip whitespace or drop an
assistant's reasoning, and a normaliser may merge characters, which the halving
below leaves room for. When even this floor is over the budget, the request is
refused at once: an 8 MiB message costs a few milliseconds, not seconds of
tokenizer time. Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.trimming import head_length
from proxy.types import Message

_COUNTED_ROLES = frozenset(("system", "developer", "user"))
_WHITESPACE = (" ", "\n", "\t", "\r")
# Normalisers (NFKC and the like) may merge a few characters into one.
_SLACK = 2


def _chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content) - sum(content.count(w) for w in _WHITESPACE)
    if isinstance(content, list):
        return sum(_chars(part.get("text")) for part in content if isinstance(part, dict))
    return 0


def prompt_floor(messages: Sequence[Message], max_token_chars: int) -> int:
    """Tokens that the kept part of ``messages`` needs at the very least."""
    return _floor(_kept_counted(messages), max_token_chars)


def _floor(kept: list[Message], max_token_chars: int) -> int:
    return sum(_chars(m.get("content")) for m in kept) // (max_token_chars * _SLACK)


def floor_over(messages: Sequence[Message], max_token_chars: int, budget: int) -> int | None:
    """``prompt_floor`` when it is over ``budget``, else None; most prompts are under
    by far, and their lengths alone (whitespace and all: more than the floor counts)
    say so without counting the whitespace."""
    kept = _kept_counted(messages)
    rough = 0
    for message in kept:
        content = message.get("content")
        rough += len(content) if isinstance(content, str) else _chars(content)
    if rough // (max_token_chars * _SLACK) <= budget:
        return None
    floor = _floor(kept, max_token_chars)
    return floor if floor > budget else None


def _kept_counted(messages: Sequence[Message]) -> list[Message]:
    """The messages of the head and the last turn (as ``trimming.split_turns`` finds
    them) whose text a template keeps: system, developer and user."""
    # From both ends: a conversation ends with its user message, one step back.
    n = len(messages)
    head = head_length(messages)
    last = n - 1
    while last > head and messages[last].get("role") != "user":
        last -= 1
    # The head is all system and developer messages: counted, every one.
    kept = list(messages[:head])
    for i in range(max(last, head), n):
        if messages[i].get("role") in _COUNTED_ROLES:
            kept.append(messages[i])
    return kept


def size_floor(body_bytes: int, max_token_chars: int) -> int:
    """The most ``prompt_floor`` can be for a body of ``body_bytes``: every character
    of its text came from at least one byte of the JSON. At or under the budget, the
    scan of the text is not needed."""
    return body_bytes // (max_token_chars * _SLACK)
