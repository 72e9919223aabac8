"""Shapes shared across the package: the JSON aliases and the counted prompt.

No imports from the rest of the proxy, so that ``chat``, ``trimming``, the counters
and the sessions can all build on it. The ``TokenCounter`` Protocol is in
``proxy.tokens.counter``; the session store's in ``proxy.sessions.store``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: A JSON object as orjson decodes it. Messages stay plain dicts on the hot path:
#: no pydantic models, so unknown fields pass through untouched.
JSONObject = dict[str, Any]
Message = dict[str, Any]

#: The media type of every JSON body the proxy writes: answers, error envelopes and
#: the chat bodies it sends upstream.
JSON_MEDIA_TYPE = "application/json"


# Not frozen: a frozen dataclass sets every field through object.__setattr__ (~0.1 us
# a field), and this one is built on every request. Treat it as read-only.
@dataclass(slots=True)
class PromptCount:
    """The counted prompt of one message list.

    ``per_message[i]`` is the tokens attributable to ``messages[i]`` (its rendered
    chat-template segment); ``overhead`` is what belongs to no single message: BOS,
    the tool schemas, a default system prompt the template adds, the generation
    prompt. ``total`` is the prompt length the upstream will see.
    """

    per_message: tuple[int, ...]
    overhead: int
    total: int = field(init=False, repr=False, compare=False)
    """Summed once: the hot path reads it several times a request."""

    def __post_init__(self) -> None:
        self.total = self.overhead + sum(self.per_message)
