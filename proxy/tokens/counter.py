"""The one shape every token backend has (docs/architecture.md §8).

Backends are swappable behind this Protocol, the way httpx swaps transports: the
request path only ever sees ``TokenCounter`` and the ``PromptCount`` it returns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from proxy.types import JSONObject, Message, PromptCount

#: Told why a count (or part of one) was left to the local estimate: ``bound``,
#: ``error`` or ``timeout`` (``trimproxy_token_count_fallbacks_total{reason}``).
FallbackHook = Callable[[str], None]


@runtime_checkable
class TokenCounter(Protocol):
    """Counts a chat prompt the way the upstream will render it.

    ``exact`` is True when ``count(...).total`` equals the upstream's
    ``usage.prompt_tokens``. When a counter is exact but its per-message split is not
    additive for every subset (templates whose rendering depends on position), the
    request path recounts the trimmed list; ``additive`` says whether that is needed.
    ``exact`` holds for ``count_prompt`` too.
    """

    name: str
    exact: bool
    additive: bool

    @property
    def max_token_chars(self) -> int | None:
        """The most characters one token covers, when the counter knows it (its
        vocabulary's longest entry); None when it does not. The cheap floor
        (``proxy.floor``) divides a prompt's length by it."""
        ...

    async def count(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[JSONObject] | None = None,
        model: str | None = None,
    ) -> PromptCount: ...

    async def count_prompt(
        self, text: str, *, model: str | None = None, special_tokens: bool = True
    ) -> int:
        """The tokens of a raw prompt (``/v1/completions``): the text encoded as the
        engine encodes a completion prompt, no chat template, with the tokenizer's
        special tokens (BOS) added unless ``special_tokens`` is False (the request's
        ``add_special_tokens``)."""
        ...

    async def aclose(self) -> None: ...
