"""Shapes shared across the package: the JSON aliases and the counted prompt.

No imports from the rest of the proxy, so that ``chat``, ``trimming``, the counters
and the sessions can all build on it. The ``TokenCounter`` Protocol is in
``proxy.tokens.counter``; the session store's in ``proxy.sessions.store``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

#: A JSON object as orjson decodes it. Messages stay plain dicts on the hot path:
#: no pydantic models, so unknown fields pass through untouched.
JSONObject = dict[str, Any]
Message = dict[str, Any]

#: The media type of every JSON body the proxy writes: answers, error envelopes and
#: the chat bodies it sends upstream.
JSON_MEDIA_TYPE = "application/json"


# Not frozen: a frozen dataclass sets every field through object.__setattr__, and
# the per-request records (this one, PromptLimit, TrimPolicy, TrimResult, ChatRequest,
# Prepared, Allowance, RoutedPath) are built on every request, and frozen ones cost
# more on each (docs/performance.md §6).
# Nothing writes to them after they are built: treat them as read-only.
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


@dataclass(slots=True)
class PromptLimit:
    """Where a request's prompt budget comes from, so that a refusal can name the limit
    that binds and the advice that helps (``proxy.errors.context_length_exceeded``).

    ``budget`` is the most prompt tokens the request may forward; ``window`` the
    model's context length (None when unknown), ``reserve`` the completion tokens
    held back from it, ``reserve_asked`` whether the request's own ``max_tokens`` set
    that reserve, and ``max_prompt_tokens`` the operator's cap
    (``TRIMPROXY_MAX_PROMPT_TOKENS``), None when unset.
    """

    budget: int
    window: int | None = None
    reserve: int = 0
    reserve_asked: bool = False
    max_prompt_tokens: int | None = None
    reserve_setting: str = "TRIMPROXY_DEFAULT_COMPLETION_RESERVE"
    """Where a reserve the request did not ask for comes from (the default reserve, or
    the cap TRIMPROXY_MAX_COMPLETION_TOKENS)."""

    @property
    def setting_binds(self) -> bool:
        """Whether the operator's cap, not the window, sets the budget."""
        return self.max_prompt_tokens is not None and self.budget == self.max_prompt_tokens


class Asking(Protocol):
    """What the budget and the completion allowance read of a request, whatever its
    dialect (``proxy.dialects.chat.ChatRequest``, ``proxy.dialects.Conversation``)."""

    @property
    def model(self) -> str | None: ...

    @property
    def max_tokens(self) -> int | None:
        """The completion tokens each answer may take, as the request asked."""
        ...

    @property
    def n(self) -> int: ...
