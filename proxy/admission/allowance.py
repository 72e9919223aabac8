"""The completion allowance: how many tokens each answer of a request may take.

One figure serves the budget (``window - allowance - 1`` is left for the prompt) and KV
admission (``prompt + n x allowance`` is reserved), so the two never disagree. It is the
request's ``max_completion_tokens``/``max_tokens``; for a request that names none,
``TRIMPROXY_MAX_COMPLETION_TOKENS`` when set, else ``TRIMPROXY_DEFAULT_COMPLETION_RESERVE``.
With the cap set, a larger ask is lowered to it and a missing one filled in, in the body
that goes upstream, so the engine stops every answer within its allowance and the
ledger's bound is hard. Without it, a request that names no ``max_tokens`` is still let
run to the context window by vLLM (and FastChat): its allowance is only the default
reserve, and the answer may run past it (``proxy.admission.overrun``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from proxy.types import Asking

#: Response header: the client's max_tokens, when it was lowered to the cap.
CAPPED_HEADER = "x-trimproxy-max-tokens-capped"

CAP_SETTING = "TRIMPROXY_MAX_COMPLETION_TOKENS"
DEFAULT_SETTING = "TRIMPROXY_DEFAULT_COMPLETION_RESERVE"

Source = Literal["request", "cap", "default"]


# Not frozen: read-only by convention (why: proxy.types, above PromptCount).
@dataclass(slots=True)
class Allowance:
    tokens: int
    """Completion tokens each answer may take: the figure the budget and the ledger use."""
    n: int = 1
    """Answers the request asks for (``n``); each may take ``tokens``."""
    source: Source = "default"
    """``request``: its own max_tokens; ``cap``: the cap, lowered to or filled in;
    ``default``: the default reserve (the engine is told no limit)."""
    asked: int | None = None
    """The request's own max_completion_tokens/max_tokens, if it named one."""

    @property
    def bounded(self) -> bool:
        """The engine is told to stop each answer at ``tokens``: it cannot run past."""
        return self.source != "default"

    @property
    def capped(self) -> bool:
        """The request asked for more than the cap, and was lowered to it."""
        return self.asked is not None and self.asked > self.tokens

    @property
    def setting(self) -> str | None:
        """The setting the figure comes from; None when the request named it."""
        if self.source == "request":
            return None
        return CAP_SETTING if self.source == "cap" else DEFAULT_SETTING


def allowance_for(chat: Asking, cap: int | None, default: int) -> Allowance:
    """The allowance of ``chat`` under the cap (None: no cap) and the default reserve."""
    asked = chat.max_tokens
    if cap is None or (asked is not None and asked <= cap):
        if asked is None:
            return Allowance(default, chat.n, "default")
        return Allowance(asked, chat.n, "request", asked)
    return Allowance(cap, chat.n, "cap", asked)


def capped_headers(allowance: Allowance) -> dict[str, str]:
    """``X-Trimproxy-Max-Tokens-Capped: <asked>`` when the ask was lowered to the cap."""
    if allowance.capped:
        return {CAPPED_HEADER: str(allowance.asked)}
    return {}
