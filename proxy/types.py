"""Shared aliases and Protocols.

Backends (token counters, session stores) are swappable behind the Protocols here,
the way httpx swaps transports: the request path only ever sees these shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

#: A JSON object as orjson decodes it. Messages stay plain dicts on the hot path:
#: no pydantic models, so unknown fields pass through untouched.
JSONObject = dict[str, Any]
Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class PromptCount:
    """The counted prompt of one message list.

    ``per_message[i]`` is the tokens attributable to ``messages[i]`` (its rendered
    chat-template segment); ``overhead`` is what belongs to no single message: BOS,
    the tool schemas, a default system prompt the template adds, the generation
    prompt. ``total`` is the prompt length the upstream will see.
    """

    per_message: tuple[int, ...]
    overhead: int

    @property
    def total(self) -> int:
        return self.overhead + sum(self.per_message)


@runtime_checkable
class TokenCounter(Protocol):
    """Counts a chat prompt the way the upstream will render it.

    ``exact`` is True when ``count(...).total`` equals the upstream's
    ``usage.prompt_tokens``. When a counter is exact but its per-message split is not
    additive for every subset (templates whose rendering depends on position), the
    request path recounts the trimmed list; ``additive`` says whether that is needed.
    """

    name: str
    exact: bool
    additive: bool

    async def count(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[JSONObject] | None = None,
        model: str | None = None,
    ) -> PromptCount: ...

    async def aclose(self) -> None: ...
