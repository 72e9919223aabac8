"""The prepare step of the dialects beside chat (docs/architecture.md §22): the same
session, budget, count and trim as ``proxy.pipeline.prepare``, over a ``Conversation``.

A dialect's items are what trimming keeps or drops (``Conversation.roles`` is the turn
view it reads); the engine renders them as chat messages (``Wire.to_chat``, vLLM's own
conversion), so the count is the chat template's over those, and each chat message's
tokens go to the item it came from. The kept items are rendered back by the dialect,
every kept item the client's own object.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from proxy.admission.overrun import AnswerShape
from proxy.choices import Endpoint
from proxy.dependencies import Services
from proxy.dialects import responses
from proxy.dialects.conversation import Conversation
from proxy.errors import context_length_exceeded
from proxy.logs import RequestFacts
from proxy.pipeline.prepare import (
    Prepared,
    Recount,
    completion_allowance,
    floor_if_surely_too_long,
    limit_for,
    model_series,
    note_forwarded,
    note_model,
    prove_fits,
    session_identity,
    session_step,
    trim_to,
    written_cap,
)
from proxy.sessions.identity import Identity
from proxy.trimming import TrimResult, fits_whole
from proxy.types import JSONObject, Message, PromptCount

#: The headers coding agents name their conversation by, read on the dialects' routes
#: when ``TRIMPROXY_SESSION_HEADER`` is absent: the Codex CLI sends ``session_id``
#: (docs/sessions.md).
AGENT_SESSION_HEADERS = ("session_id", "session-id")

ToChat = Callable[[Conversation, Sequence[int]], tuple[list[Message], list[int]]]
Render = Callable[[Conversation, Sequence[int], int | None], bytes]
Tools = Callable[[Conversation, Sequence[int]], list[JSONObject] | None]


@dataclass(frozen=True, slots=True)
class Wire:
    """One dialect's pieces the pipeline calls (``proxy.dialects``)."""

    endpoint: Endpoint
    """Its ``endpoint`` label in the metrics and the access line."""
    to_chat: ToChat
    render: Render
    tools: Tools
    answer: AnswerShape
    """How its answers show their completion tokens (the overrun watch)."""


def _tools(conv: Conversation, kept: Sequence[int]) -> list[JSONObject] | None:
    return conv.tools


def wire(
    endpoint: Endpoint,
    to_chat: ToChat,
    render: Render,
    answer: AnswerShape,
    tools: Tools | None = None,
) -> Wire:
    return Wire(endpoint, to_chat, render, tools or _tools, answer)


def _recount(svc: Services, w: Wire, conv: Conversation) -> Recount:
    """The count of kept items as the engine renders them (the dialect's ``to_chat``)."""

    async def recount(kept: Sequence[int]) -> int:
        messages, _ = w.to_chat(conv, kept)
        tools = w.tools(conv, kept)
        return (await svc.counter.count(messages, tools=tools, model=conv.model)).total

    return recount


async def _per_item(
    svc: Services, w: Wire, conv: Conversation, messages: list[Message], owner: list[int]
) -> PromptCount:
    """The count of every item: each chat message's tokens go to the item it came from."""
    tools = w.tools(conv, range(len(conv.items)))
    counted = await svc.counter.count(messages, tools=tools, model=conv.model)
    per = [0] * len(conv.items)
    for j, tokens in enumerate(counted.per_message):
        per[owner[j]] += tokens
    return PromptCount(tuple(per), counted.overhead)


async def input_tokens(svc: Services, w: Wire, conv: Conversation) -> int:
    """The whole request's prompt tokens, as the engine renders it: what vLLM's
    ``/v1/messages/count_tokens`` answers (its chat conversion and template, tools
    included), from the counter's per-message caches."""
    everything = range(len(conv.items))
    messages, _ = w.to_chat(conv, everything)
    tools = w.tools(conv, everything)
    return (await svc.counter.count(messages, tools=tools, model=conv.model)).total


def session_view(conv: Conversation) -> list[Message]:
    """The items as the session step hashes them: each one's turn role and the item."""
    if conv.endpoint == "responses":  # every user message a turn (docs/sessions.md)
        roles = responses.session_roles(conv)
    else:
        roles = [r["role"] for r in conv.roles]
    return [{"role": r, "content": item} for r, item in zip(roles, conv.items, strict=True)]


async def prepare_conversation(
    w: Wire, conv: Conversation, raw: bytes, headers: Mapping[str, str], svc: Services,
    facts: RequestFacts, *, chain: Identity | None = None,
) -> Prepared:  # fmt: skip
    """Session, budget, count, trim of a dialect's request: what to forward. ``chain``:
    the session of the stored chain the request continues (``proxy.pipeline.chain``)."""
    note_model(svc.settings.max_model_name_length, conv.model, facts, w.endpoint)
    out: dict[str, str] = {}
    view = session_view(conv)
    ident = session_identity(svc, headers, conv.user, view, AGENT_SESSION_HEADERS)
    if ident is not None and chain is not None:
        ident = chain
    history_start = 0
    if ident is not None and svc.sessions is not None:
        history_start = await session_step(svc, ident, view, facts, out, w.endpoint)
    allowance = completion_allowance(svc, conv)
    cap = written_cap(allowance, out)
    limit = await limit_for(svc, conv, allowance)
    budget = None if limit is None else limit.budget
    messages, owner = w.to_chat(conv, range(len(conv.items)))
    if limit is not None and (floor := floor_if_surely_too_long(svc, messages, budget, raw)):
        raise context_length_exceeded(floor, limit, at_least=True)
    began = time.monotonic()
    count = await _per_item(svc, w, conv, messages, owner)
    counted_in = time.monotonic() - began
    metrics = await model_series(svc, conv.model, w.endpoint)
    metrics.prompt_received.observe(count.total)
    facts.prompt_tokens_received = count.total
    if fits_whole(count.total, budget, svc.settings.max_history_turns, history_start):
        result = TrimResult(tuple(range(len(conv.items))), count.total, None)
    else:
        policy, result = trim_to(svc.settings, conv.roles, count, limit, history_start)
        if not svc.counter.additive:
            recount = _recount(svc, w, conv)
            began = time.monotonic()
            result, tokens = await prove_fits(
                conv.roles, recount, count, policy, history_start, result
            )
            counted_in += time.monotonic() - began
            result = replace(result, tokens=tokens)
    dropped = result.dropped(len(conv.items))
    reason = (result.reason or "budget") if dropped else None
    if dropped:
        metrics.trimmed(dropped, max(0, count.total - result.tokens), reason or "budget")
    body = raw if not dropped and cap is None else w.render(conv, result.kept, cap)
    note_forwarded(metrics, facts, out, result.tokens, dropped)
    return Prepared(
        body=body, received_tokens=count.total, forwarded_tokens=result.tokens,
        dropped=dropped, trim_reason=reason, budget=budget, headers=out,
        session_id=facts.session_id, reserve=allowance.tokens, allowance=allowance,
        series=metrics, session_key=ident.key if ident else None, stream=conv.stream,
        shape=w.answer, counted_in=counted_in,
    )  # fmt: skip
