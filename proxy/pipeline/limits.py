"""The request's limits before anything is counted (docs/architecture.md §5, §7): the
completion allowance (its share of the window and of the KV reservation), the cap
written into the body, the prompt budget, and the cheap floor that refuses a prompt
surely over it."""

from __future__ import annotations

from collections.abc import Sequence

from proxy.admission.allowance import Allowance, allowance_for, capped_headers
from proxy.dependencies import Services
from proxy.errors import no_room_for_prompt
from proxy.floor import floor_over, size_floor
from proxy.types import Asking, Message, PromptLimit


def completion_allowance(svc: Services, chat: Asking) -> Allowance:
    """Each answer's share of the window and of the KV reservation: the request's
    ``max_tokens`` (lowered to TRIMPROXY_MAX_COMPLETION_TOKENS), else the cap, else
    TRIMPROXY_DEFAULT_COMPLETION_RESERVE (``proxy.admission.allowance``)."""
    settings = svc.settings
    return allowance_for(chat, settings.max_completion_tokens, settings.default_completion_reserve)


def written_cap(allowance: Allowance, headers: dict[str, str]) -> int | None:
    """The completion tokens to write into a dialect's body when the cap lowered or
    filled them in (its header goes in ``headers``); None when the client's stand."""
    if allowance.source != "cap":
        return None
    headers.update(capped_headers(allowance))
    return allowance.tokens


async def context_window(svc: Services, chat: Asking) -> int | None:
    """The model's context length: the setting, else what the upstream reports."""
    window = svc.settings.context_window
    if window is None and chat.model is not None:
        window = await svc.windows.get(chat.model)
    return window


def budget_of(window: int | None, reserve: int, max_prompt_tokens: int | None) -> int | None:
    """``min(max_prompt_tokens, window - reserve - 1)``; None when unbounded, and below
    1 when the reserve leaves the prompt no room.

    The one token of slack is FastChat's: its worker keeps only
    ``context - max_new_tokens - 1`` prompt tokens and silently drops the first one
    of a prompt that fills the rest exactly. vLLM loses nothing by it.
    """
    if window is None:
        return max_prompt_tokens
    room = window - reserve - 1
    return room if max_prompt_tokens is None else min(max_prompt_tokens, room)


async def limit_for(
    svc: Services, chat: Asking, allowance: Allowance | None = None
) -> PromptLimit | None:
    """The request's prompt budget and where it comes from; None when unbounded.
    Refuses a completion reserve that leaves the prompt no room. ``allowance``: the
    request's, when the caller has it already (it is worked out once a request)."""
    window = await context_window(svc, chat)
    if allowance is None:
        allowance = completion_allowance(svc, chat)
    reserve = allowance.tokens
    setting = svc.settings.max_prompt_tokens or None
    budget = budget_of(window, reserve, setting)
    if budget is None:
        return None
    named = allowance.setting  # a property: read once, it runs on every request
    if budget < 1 and window is not None:  # the setting is at least 1: the reserve's doing
        raise no_room_for_prompt(window, reserve, named)
    return PromptLimit(budget, window, reserve, named is None, setting, named or "max_tokens")


def floor_if_surely_too_long(
    svc: Services, messages: Sequence[Message], budget: int | None, raw: bytes
) -> int | None:
    """The cheap floor (``proxy.floor``) when it is over the budget, before counting."""
    if budget is None:
        return None
    body_bytes = len(raw)
    longest = svc.counter.max_token_chars
    # The floor counts characters of the body's text, never more than its bytes: a
    # body that small cannot be over, and most are, so they skip the scan.
    if longest is None or size_floor(body_bytes, longest) <= budget:
        return None
    return floor_over(messages, longest, budget)
