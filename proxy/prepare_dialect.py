"""The prepare step of the dialects beside chat (docs/architecture.md §22): the same
session, budget, count and trim as ``proxy.prepare``, over a ``Conversation``.

A dialect's items are what trimming keeps or drops (``Conversation.roles`` is the turn
view it reads); the engine renders them as chat messages (``Wire.to_chat``, vLLM's own
conversion), so the count is the chat template's over those, and each chat message's
tokens go to the item it came from. The kept items are rendered back by the dialect,
every kept item the client's own object.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from proxy.admission.allowance import Allowance, capped_headers
from proxy.dependencies import Services
from proxy.dialects.conversation import Conversation
from proxy.errors import ContextLengthExceeded, context_length_exceeded
from proxy.floor import floor_over
from proxy.logs import RequestFacts
from proxy.prepare import (
    PROMPT_TOKENS,
    TRIMMED_MESSAGES,
    Prepared,
    completion_allowance,
    limit_for,
    model_series,
    session_identity,
    session_step,
)
from proxy.trimming import TrimPolicy, TrimResult, fits_whole, least_kept, trim
from proxy.types import JSONObject, Message, PromptCount, PromptLimit

ToChat = Callable[[Conversation, Sequence[int]], tuple[list[Message], list[int]]]
Render = Callable[[Conversation, Sequence[int], int | None], bytes]
Tools = Callable[[Conversation, Sequence[int]], list[JSONObject] | None]
# Rounds of recount-and-tighten before giving up on a non-additive counter.
_RECOUNTS = 4


@dataclass(frozen=True, slots=True)
class Wire:
    """One dialect's pieces the pipeline calls (``proxy.dialects``)."""

    endpoint: str
    to_chat: ToChat
    render: Render
    tools: Tools


def _tools(conv: Conversation, kept: Sequence[int]) -> list[JSONObject] | None:
    return conv.tools


def wire(endpoint: str, to_chat: ToChat, render: Render, tools: Tools | None = None) -> Wire:
    return Wire(endpoint, to_chat, render, tools or _tools)


class _Counting:
    """Counts kept items as the engine renders them, and per item."""

    def __init__(self, svc: Services, w: Wire, conv: Conversation) -> None:
        self.svc, self.wire, self.conv = svc, w, conv

    async def total(self, kept: Sequence[int]) -> int:
        messages, _ = self.wire.to_chat(self.conv, kept)
        tools = self.wire.tools(self.conv, kept)
        counted = await self.svc.counter.count(messages, tools=tools, model=self.conv.model)
        return counted.total

    async def per_item(self) -> tuple[PromptCount, list[Message]]:
        everything = range(len(self.conv.items))
        messages, owner = self.wire.to_chat(self.conv, everything)
        tools = self.wire.tools(self.conv, everything)
        counted = await self.svc.counter.count(messages, tools=tools, model=self.conv.model)
        per = [0] * len(self.conv.items)
        for j, tokens in enumerate(counted.per_message):
            per[owner[j]] += tokens
        return PromptCount(tuple(per), counted.overhead), messages


def session_view(conv: Conversation) -> list[Message]:
    """The items as the session step hashes them: each one's turn role and the item."""
    roles, items = conv.roles, conv.items
    return [{"role": r["role"], "content": item} for r, item in zip(roles, items, strict=True)]


async def prepare_conversation(
    w: Wire, conv: Conversation, raw: bytes, headers: Mapping[str, str], svc: Services,
    facts: RequestFacts,
) -> Prepared:  # fmt: skip
    """Session, budget, count, trim of a dialect's request: what to forward."""
    facts.model = conv.model
    out: dict[str, str] = {}
    view = session_view(conv)
    ident = session_identity(svc, headers, conv.user, view)
    history_start = 0
    if ident is not None and svc.sessions is not None:
        history_start = await session_step(svc, ident, view, facts, out)
    allowance = completion_allowance(svc, conv)
    cap = _capped(allowance, out)
    limit = await limit_for(svc, conv, allowance)
    counting = _Counting(svc, w, conv)
    count, messages = await counting.per_item()
    _refuse_surely_over(svc, messages, limit)
    metrics = await model_series(svc, conv.model)
    metrics.prompt_received.observe(count.total)
    facts.prompt_tokens_received = count.total
    result = await _keep(svc, conv, count, limit, history_start, counting)
    dropped = result.dropped(len(conv.items))
    reason = (result.reason or "budget") if dropped else None
    if dropped:
        metrics.trimmed(dropped, max(0, count.total - result.tokens), reason or "budget")
    body = raw if not dropped and cap is None else w.render(conv, result.kept, cap)
    metrics.prompt_forwarded.observe(result.tokens)
    facts.prompt_tokens_forwarded, facts.messages_dropped = result.tokens, dropped
    out[PROMPT_TOKENS] = str(result.tokens)
    out[TRIMMED_MESSAGES] = str(dropped)
    return Prepared(
        body=body, received_tokens=count.total, forwarded_tokens=result.tokens,
        dropped=dropped, trim_reason=reason, budget=None if limit is None else limit.budget,
        headers=out, session_id=facts.session_id, reserve=allowance.tokens,
        allowance=allowance, series=metrics, session_key=ident.key if ident else None,
    )  # fmt: skip


def _capped(allowance: Allowance, out: dict[str, str]) -> int | None:
    """The completion tokens to write into the body (the cap lowered or filled them in)."""
    if allowance.source != "cap":
        return None
    out.update(capped_headers(allowance))
    return allowance.tokens


def _refuse_surely_over(svc: Services, messages: list[Message], limit: PromptLimit | None) -> None:
    longest = svc.counter.max_token_chars
    if limit is None or longest is None:
        return
    floor = floor_over(messages, longest, limit.budget)
    if floor is not None:
        raise context_length_exceeded(floor, limit, at_least=True)


async def _keep(
    svc: Services,
    conv: Conversation,
    count: PromptCount,
    limit: PromptLimit | None,
    history_start: int,
    counting: _Counting,
) -> TrimResult:
    """The items to forward and their count, proved by a recount for a counter that is
    not additive (as ``proxy.prepare.prove_fits``)."""
    settings = svc.settings
    budget = None if limit is None else limit.budget
    n = len(conv.items)
    if fits_whole(count.total, budget, settings.max_history_turns, history_start):
        return TrimResult(tuple(range(n)), count.total, None)
    policy = TrimPolicy(
        budget=budget,
        target=settings.trim_target,
        max_history_turns=settings.max_history_turns,
        pin_first_user=settings.pin_first_user,
        limit=limit,
    )
    result = trim(conv.roles, count, policy, history_start=history_start)
    if svc.counter.additive or len(result.kept) == n or budget is None:
        return result
    tightened = policy
    for _ in range(_RECOUNTS):
        actual = await counting.total(result.kept)
        if actual <= budget:
            return replace(result, tokens=actual)
        tightened = replace(
            tightened, budget=(tightened.budget or budget) - (actual - result.tokens)
        )
        try:
            result = trim(conv.roles, count, tightened, history_start=history_start)
        except ContextLengthExceeded:
            break
    least = least_kept(conv.roles)
    actual = await counting.total(least)
    if actual <= budget:
        return TrimResult(least, actual, "budget")
    raise context_length_exceeded(actual, limit or PromptLimit(budget))
