"""The *prepare* step of the chat route: session, budget, count, trim, and the facts.

``prepare`` takes a parsed chat request, the request's headers (its session identity)
and the services, and decides what goes
upstream: the body bytes (the client's own when nothing was dropped), the counted
tokens, what was dropped and why, and the response headers. It records the
request's metrics and log facts as it goes, so a request refused half-way (a
session limit, a prompt that cannot fit) still logs what was known by then. No
HTTP is spoken here: tests call it directly with an in-memory counter.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import orjson

from proxy.admission.allowance import Allowance, allowance_for, capped_headers, with_allowance
from proxy.admission.overrun import CHAT_ANSWER, AnswerShape
from proxy.chat import ChatRequest, with_messages
from proxy.choices import Endpoint
from proxy.dependencies import Services
from proxy.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    ProxyError,
    context_length_exceeded,
    no_room_for_prompt,
)
from proxy.floor import floor_over, size_floor
from proxy.logs import RequestFacts
from proxy.metrics import OTHER_MODEL, ModelSeries
from proxy.sessions.gate import SESSION_ID
from proxy.sessions.identity import Identity, identify
from proxy.settings import Settings
from proxy.trimming import TrimPolicy, TrimResult, fits_whole, least_kept, trim
from proxy.types import Asking, Message, PromptCount, PromptLimit

#: Response header: the prompt tokens forwarded.
PROMPT_TOKENS = "x-trimproxy-prompt-tokens"
#: Response header: how many messages were dropped.
TRIMMED_MESSAGES = "x-trimproxy-trimmed-messages"
# Rounds of recount-and-tighten before giving up on a non-additive counter.
_RECOUNTS = 4


# Not frozen: read-only by convention (why: proxy.types, above PromptCount).
@dataclass(slots=True)
class Prepared:
    """What to send upstream, and what the answer and the log say about it."""

    body: bytes
    """The body to forward: the client's bytes unchanged when nothing was dropped."""
    received_tokens: int
    forwarded_tokens: int
    dropped: int
    """Messages dropped by trimming (not those before a session's reset point)."""
    trim_reason: str | None
    """``budget``, ``max_turns`` or ``session`` when something was dropped."""
    budget: int | None
    headers: dict[str, str]
    """Response headers for the client: token counts and the session's headers."""
    session_id: str | None
    reserve: int = 0
    """Completion tokens each answer may take (``allowance.tokens``)."""
    allowance: Allowance | None = None
    """The completion allowance: per answer, ``n``, and where it came from."""
    series: ModelSeries | None = None
    """The request's per-model metric series (the relay observes the estimate error)."""
    session_key: str | None = None
    """The session's identity (``identify``, worked out once a request) when session
    limits or session routing need it; None otherwise."""
    request: ChatRequest | None = None
    """The parsed request it was prepared from (the forward step reads its stream flags)."""
    counted_in: float = 0.0
    """Seconds the count and the recounts took (the engine's ``/tokenize``, where it counts):
    the forward's wait for the answer gets what is left of the read timeout."""

    @property
    def endpoint(self) -> Endpoint:
        """The API the prompt came in by (its series' ``endpoint`` label)."""
        return "chat" if self.series is None else self.series.endpoint

    stream: bool = False
    """The answer is streamed."""
    shape: AnswerShape = CHAT_ANSWER
    """How the answer shows its completion tokens (``proxy.admission.overrun``)."""


async def model_series(
    svc: Services, model: str | None, endpoint: Endpoint = "chat"
) -> ModelSeries:
    """The metric series of ``model`` on ``endpoint``: a name from the models file or one
    the upstream lists (``/v1/models``, cached) is its own label, any other is ``other``."""
    label = svc.model_label
    if label is None:
        label = OTHER_MODEL
        if model is not None:
            # A loop, not any() over a generator: no generator frame on every request.
            for served in await svc.upstream.models():
                if served.id == model:
                    label = model
                    break
    return svc.metrics.for_model(label, endpoint)


def completion_allowance(svc: Services, chat: Asking) -> Allowance:
    """Each answer's share of the window and of the KV reservation: the request's
    ``max_tokens`` (lowered to TRIMPROXY_MAX_COMPLETION_TOKENS), else the cap, else
    TRIMPROXY_DEFAULT_COMPLETION_RESERVE (``proxy.admission.allowance``)."""
    settings = svc.settings
    return allowance_for(chat, settings.max_completion_tokens, settings.default_completion_reserve)


def completion_reserve(svc: Services, chat: ChatRequest) -> int:
    """The answer's share of the window (``completion_allowance``)."""
    return completion_allowance(svc, chat).tokens


def untrimmed(raw: bytes, chat: ChatRequest, upstream: ChatRequest) -> bytes:
    """The body of a request nothing was dropped from: the client's bytes, unless the
    cap rewrote ``upstream``'s max_tokens."""
    return raw if upstream is chat else orjson.dumps(upstream.body)


def written_cap(allowance: Allowance, headers: dict[str, str]) -> int | None:
    """The completion tokens to write into a dialect's body when the cap lowered or
    filled them in (its header goes in ``headers``); None when the client's stand."""
    if allowance.source != "cap":
        return None
    headers.update(capped_headers(allowance))
    return allowance.tokens


def apply_allowance(
    svc: Services, chat: ChatRequest, headers: dict[str, str]
) -> tuple[ChatRequest, Allowance]:
    """The request to forward under the cap (its body rewritten when the cap lowered or
    filled in its max_tokens) and its allowance; the capped header goes in ``headers``."""
    allowance = completion_allowance(svc, chat)
    if allowance.source == "cap":
        headers.update(capped_headers(allowance))
        return with_allowance(chat, allowance), allowance
    return chat, allowance


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


#: The count of the kept messages (or items) of a request, as the engine renders them.
Recount = Callable[[Sequence[int]], Awaitable[int]]


async def prove_fits(
    messages: Sequence[Message],
    recount: Recount,
    count: PromptCount,
    policy: TrimPolicy,
    history_start: int,
    result: TrimResult,
) -> tuple[TrimResult, int]:
    """Prove that ``result`` (``trim`` of ``messages`` under ``policy``) fits: returns
    the result to forward and its count.

    A counter whose per-message split is not additive for every subset (the chat
    template renders a message differently by position) gets the kept list recounted;
    when that is over the budget, the budget is tightened by the excess and trimmed
    again, so the budget is a guarantee, not an estimate. When that does not settle
    (or the tightened budget is below even the least the request keeps), the least
    itself, the system block and the last turn, is recounted: forwarded when it fits,
    else the refusal names its real count. An additive counter's sums are the count
    itself: the chat route awaits this only for the others.
    """
    if len(result.kept) == len(messages) or policy.budget is None:
        return result, result.tokens
    budget = policy.budget
    tightened = policy
    for _ in range(_RECOUNTS):
        actual = await recount(result.kept)
        if actual <= budget:
            return result, actual
        excess = actual - result.tokens
        tightened = replace(tightened, budget=(tightened.budget or budget) - excess)
        try:
            result = trim(messages, count, tightened, history_start=history_start)
        except ContextLengthExceeded:
            break
    least = least_kept(messages)
    actual = await recount(least)
    if actual <= budget:
        return TrimResult(least, actual, "budget"), actual
    raise context_length_exceeded(actual, policy.limit or PromptLimit(budget))


def chat_recount(svc: Services, chat: ChatRequest) -> Recount:
    async def recount(kept: Sequence[int]) -> int:
        messages = [chat.messages[i] for i in kept]
        return (await svc.counter.count(messages, tools=chat.tools, model=chat.model)).total

    return recount


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


def session_identity(
    svc: Services,
    headers: Mapping[str, str],
    user: str | None,
    messages: Sequence[Message],
    also: Sequence[str] = (),
) -> Identity | None:
    """The request's session identity, when session limits or session routing over
    several engines need it (one hash a request); else None. ``also``: header names
    read after ``TRIMPROXY_SESSION_HEADER`` (``identify``)."""
    settings = svc.settings
    if svc.sessions is None and (
        settings.routing != "session" or len(svc.upstream.engines.live()) < 2
    ):
        return None
    return identify(headers, settings.session_header, user, messages, also)


async def session_step(
    svc: Services,
    ident: Identity,
    messages: Sequence[Message],
    facts: RequestFacts,
    out: dict[str, str],
    endpoint: Endpoint = "chat",
) -> int:
    """The session limits (``proxy.sessions``): where the history the session keeps
    starts; the session's headers go in ``out``, a limit hit is counted on ``endpoint``."""
    assert svc.sessions is not None
    try:
        admission = await svc.sessions.admit(ident, messages, endpoint)
    except ProxyError as exc:  # a rejection still names its session
        facts.session_id = exc.headers.get(SESSION_ID)
        raise
    out.update(admission.headers)
    facts.session_id = admission.headers.get(SESSION_ID)
    return admission.history_start


def note_model(
    most: int, model: str | None, facts: RequestFacts, endpoint: Endpoint = "chat"
) -> None:
    """The request's model and endpoint for the access line; the model checked before
    anything keeps or logs it: the name is the client's, of any length."""
    facts.endpoint = endpoint
    if model is not None and len(model) > most:
        raise InvalidRequest(
            f"'model' is {len(model)} characters long; this proxy accepts names of at most "
            f"{most} (TRIMPROXY_MAX_MODEL_NAME_LENGTH). Use a model name from GET /v1/models.",
            param="model",
        )
    facts.model = model


def trim_to(
    settings: Settings,
    messages: Sequence[Message],
    count: PromptCount,
    limit: PromptLimit | None,
    history_start: int,
) -> tuple[TrimPolicy, TrimResult]:
    """What to keep of a prompt over its budget or turn limit, under the settings'
    policy; a counter that is not additive proves it next (``prove_fits``)."""
    policy = TrimPolicy(
        budget=None if limit is None else limit.budget,
        target=settings.trim_target,
        max_history_turns=settings.max_history_turns,
        pin_first_user=settings.pin_first_user,
        limit=limit,
    )
    return policy, trim(messages, count, policy, history_start=history_start)


def note_forwarded(
    metrics: ModelSeries, facts: RequestFacts, out: dict[str, str], forwarded: int, dropped: int
) -> None:
    """The forwarded prompt in the metrics, the access line and the response headers."""
    metrics.prompt_forwarded.observe(forwarded)
    facts.prompt_tokens_forwarded, facts.messages_dropped = forwarded, dropped
    out[PROMPT_TOKENS] = str(forwarded)
    out[TRIMMED_MESSAGES] = str(dropped)


async def prepare(
    chat: ChatRequest,
    raw: bytes,
    headers: Mapping[str, str],
    svc: Services,
    facts: RequestFacts,
) -> Prepared:
    """Session, budget, count, trim: what to forward for ``chat`` (read from ``raw``).
    ``headers``: the request's, case-insensitive (its session identity); ``facts``: its
    access-log record, filled in as the facts become known."""
    settings = svc.settings
    note_model(settings.max_model_name_length, chat.model, facts)
    history_start = 0
    # A literal: calling dict[str, str] raises and catches (docs/performance.md §6).
    out: dict[str, str] = {}
    # A lone engine is never routed: no identity to work out for routing alone
    # (docs/performance.md §6).
    wanted = svc.sessions is not None or (
        settings.routing == "session" and svc.upstream.lone is None
    )
    ident = session_identity(svc, headers, chat.user, chat.messages) if wanted else None
    if ident is not None and svc.sessions is not None:
        history_start = await session_step(svc, ident, chat.messages, facts, out)
    upstream, allowance = apply_allowance(svc, chat, out)
    limit = await limit_for(svc, chat, allowance)
    budget = None if limit is None else limit.budget
    if limit is not None and (floor := floor_if_surely_too_long(svc, chat.messages, budget, raw)):
        raise context_length_exceeded(floor, limit, at_least=True)
    began = time.monotonic()
    count = await svc.counter.count(chat.messages, tools=chat.tools, model=chat.model)
    counted_in = time.monotonic() - began
    metrics = await model_series(svc, chat.model)
    metrics.prompt_received.observe(count.total)
    facts.prompt_tokens_received = count.total
    if fits_whole(count.total, budget, settings.max_history_turns, history_start):
        forwarded, dropped, body, reason = count.total, 0, untrimmed(raw, chat, upstream), None
    else:
        trimmed = await _trimmed(svc, chat, raw, upstream, count, limit, history_start, metrics)
        forwarded, dropped, body, reason, proved_in = trimmed
        counted_in += proved_in
    note_forwarded(metrics, facts, out, forwarded, dropped)
    return Prepared(
        body=body,
        received_tokens=count.total,
        forwarded_tokens=forwarded,
        dropped=dropped,
        trim_reason=reason,
        budget=budget,
        headers=out,
        session_id=facts.session_id,
        reserve=allowance.tokens,
        allowance=allowance,
        series=metrics,
        session_key=ident.key if ident is not None else None,
        request=chat,
        counted_in=counted_in,
        stream=chat.stream,
    )


async def _trimmed(
    svc: Services,
    chat: ChatRequest,
    raw: bytes,
    upstream: ChatRequest,
    count: PromptCount,
    limit: PromptLimit | None,
    history_start: int,
    metrics: ModelSeries,
) -> tuple[int, int, bytes, str | None, float]:
    """``prepare``'s prompt that does not fit whole: what is forwarded and dropped, the
    body, the reason, and the seconds a recount took (a counter that is not additive
    proves the kept messages fit)."""
    policy, result = trim_to(svc.settings, chat.messages, count, limit, history_start)
    forwarded, proved_in = result.tokens, 0.0
    if not svc.counter.additive:
        recount = chat_recount(svc, chat)
        began = time.monotonic()
        result, forwarded = await prove_fits(
            chat.messages, recount, count, policy, history_start, result
        )
        proved_in = time.monotonic() - began
    dropped = result.dropped(len(chat.messages))
    if not dropped:
        return forwarded, 0, untrimmed(raw, chat, upstream), None, proved_in
    reason = result.reason or "budget"
    body = with_messages(upstream, [chat.messages[i] for i in result.kept])
    metrics.trimmed(dropped, max(0, count.total - forwarded), reason)
    return forwarded, dropped, body, reason, proved_in
