"""A floor on a prompt's token count from its length alone, before any tokenizer runs.

No token covers more characters than the vocabulary's longest entry
(``max_token_chars`` on the counters that know it), so a text of ``c`` characters
is at least ``c / max_token_chars`` tokens. Only what trimming must keep is
counted (the leading system/developer block and the last turn, DESIGN section 3,
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

from proxy.trimming import split_turns
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
    turns = split_turns(messages)
    last = turns.starts[-1] if turns.starts else turns.head
    kept = [*messages[: turns.head], *messages[last:]]
    chars = sum(_chars(m.get("content")) for m in kept if m.get("role") in _COUNTED_ROLES)
    return chars // (max_token_chars * _SLACK)


def max_token_chars(counter: object) -> int | None:
    """The counter's longest token in characters, when it knows it."""
    value = getattr(counter, "max_token_chars", None)
    return value if isinstance(value, int) and value > 0 else None
