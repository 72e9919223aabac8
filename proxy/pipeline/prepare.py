"""The *prepare* step of every prompt route (docs/architecture.md §1, §22): session,
budget, count, trim, and the facts, once for every dialect.

``prepare`` takes a dialect (``proxy.pipeline.dialect``), the request parsed by it, the
request's headers (its session identity) and the services, and decides what goes
upstream: the body bytes (the client's own when nothing was dropped), the counted
tokens, what was dropped and why, and the response headers. It records the request's
metrics and log facts as it goes, so a request refused half-way (a session limit, a
prompt that cannot fit) still logs what was known by then. No HTTP is spoken here:
tests call it directly with an in-memory counter.

A dialect's items are what trimming keeps or drops (``Conversation.roles`` is the turn
view it reads); the engine renders them as chat messages (the dialect's chat view), so
the count is the chat template's over those, and each chat message's tokens go to the
item it came from. The kept items are rendered back by the dialect, every kept item
the client's own object. A raw prompt (``/v1/completions``) has no turns: it is
counted exactly and refused over the budget, never forwarded whole.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, replace

from proxy.admission.allowance import Allowance
from proxy.choices import Endpoint
from proxy.dependencies import Services
from proxy.dialects.conversation import Conversation
from proxy.errors import InvalidRequest, ProxyError, context_length_exceeded
from proxy.ladder_step import conversation_ladder, may_clear
from proxy.logs import RequestFacts
from proxy.metrics import OTHER_MODEL, ModelSeries
from proxy.pipeline.dialect import ChatView, Dialect
from proxy.pipeline.limits import (
    completion_allowance,
    floor_if_surely_too_long,
    limit_for,
    written_cap,
)
from proxy.pipeline.prove import Recount, prove_fits, trim_to
from proxy.sessions.gate import SESSION_ID
from proxy.sessions.identity import Identity, identify
from proxy.trimming import TrimPolicy, TrimResult, fits_whole
from proxy.types import Message, PromptCount, PromptLimit

#: Response header: the prompt tokens forwarded.
PROMPT_TOKENS = "x-trimproxy-prompt-tokens"
#: Response header: how many messages were dropped.
TRIMMED_MESSAGES = "x-trimproxy-trimmed-messages"


# Not frozen: read-only by convention (why: proxy.types, above PromptCount).
@dataclass(slots=True, kw_only=True)
class Prepared:
    """What to send upstream, and what the answer and the log say about it."""

    body: bytes
    """The body to forward: the client's bytes unchanged when nothing was dropped."""
    received_tokens: int
    forwarded_tokens: int
    dropped: int
    """Items dropped by trimming (not those before a session's reset point)."""
    trim_reason: str | None
    """``budget``, ``max_turns`` or ``session`` when something was dropped."""
    budget: int | None
    headers: dict[str, str]
    """Response headers for the client: token counts and the session's headers."""
    session_id: str | None
    allowance: Allowance
    """The completion allowance: per answer, ``n``, and where it came from."""
    series: ModelSeries
    """The request's per-model metric series (the relay observes the estimate error)."""
    dialect: Dialect
    """The wire format it came in by: its continuation form, its answer's shape, its
    usage reader."""
    request: Conversation
    """The parsed request it was prepared from (the forward step reads its flags)."""
    session_key: str | None = None
    """The session's identity (``identify``, worked out once a request) when session
    limits or session routing need it; None otherwise."""
    counted_in: float = 0.0
    """Seconds the count and the recounts took (the engine's ``/tokenize``, where it counts):
    the forward's wait for the answer gets what is left of the read timeout."""

    @property
    def endpoint(self) -> Endpoint:
        """The API the prompt came in by (its series' ``endpoint`` label)."""
        return self.dialect.endpoint

    @property
    def reserve(self) -> int:
        """Completion tokens each answer may take (``allowance.tokens``)."""
        return self.allowance.tokens

    @property
    def stream(self) -> bool:
        """The answer is streamed."""
        return self.request.stream


# Not frozen: read-only by convention (why: proxy.types, above PromptCount).
@dataclass(slots=True)
class Kept:
    """What the trim step kept of a prompt that does not fit whole: the items and their
    count, how many were dropped and why, and the seconds a proof took."""

    result: TrimResult
    dropped: int = 0
    reason: str | None = None
    proved_in: float = 0.0
    shown: Conversation | None = None
    """The conversation to render the kept items from, when the ladder cleared tool
    outputs in a copy of it."""


async def model_series(
    svc: Services, model: str | None, endpoint: Endpoint, route: str
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
    return svc.metrics.for_model(label, endpoint, route)


async def prepare(
    dialect: Dialect,
    conv: Conversation,
    raw: bytes,
    headers: Mapping[str, str],
    svc: Services,
    facts: RequestFacts,
    *,
    chain: Identity | None = None,
    client: Conversation | None = None,
) -> Prepared:
    """Session, budget, count, trim: what to forward for ``conv`` (read from ``raw`` by
    ``dialect``). ``headers``: the request's, case-insensitive (its session identity);
    ``facts``: its access-log record, filled in as the facts become known; ``chain``:
    the session of the stored chain a Responses request continues
    (``proxy.pipeline.chain``); ``client``: the conversation as the client sent it, when
    ``conv`` is the dialect's edit of it (the session sees the client's history)."""
    note_model(svc.settings.max_model_name_length, conv.model, facts, dialect.endpoint)
    # A literal: calling dict[str, str] raises and catches (docs/performance.md §6).
    out: dict[str, str] = {}
    session = _NO_SESSION
    if svc.needs_session_key():
        session = await _session(dialect, client or conv, headers, svc, facts, out, chain)
    allowance = completion_allowance(svc, conv)
    cap = written_cap(allowance, out)
    limit = await limit_for(svc, conv, allowance)
    budget = None if limit is None else limit.budget
    began = time.monotonic()
    count = await _count(dialect, conv, raw, svc, limit)
    counted_in = time.monotonic() - began
    metrics = await model_series(svc, conv.model, dialect.endpoint, dialect.path)
    metrics.prompt_received.observe(count.total)
    facts.prompt_tokens_received = count.total
    # None: it fits whole; nothing more is built nor awaited (docs/performance.md §6).
    kept = None
    if not _whole(dialect, count, budget, svc, session):
        kept = await _keep(dialect, conv, count, limit, session, svc, metrics, out, facts)
    if dialect.count_prompts is not None:  # each prompt is a request of its own
        allowance = replace(allowance, n=allowance.n * len(count.per_message))
    forwarded = count.total if kept is None else kept.result.tokens
    dropped = 0 if kept is None else kept.dropped
    body = _body(dialect, conv, raw, kept, cap)
    note_forwarded(metrics, facts, out, forwarded, dropped)
    return Prepared(
        body=body,
        received_tokens=count.total,
        forwarded_tokens=forwarded,
        dropped=dropped,
        trim_reason=None if kept is None else kept.reason,
        budget=budget,
        headers=out,
        session_id=facts.session_id,
        allowance=allowance,
        series=metrics,
        dialect=dialect,
        request=conv,
        session_key=session.key,
        counted_in=counted_in if kept is None else counted_in + kept.proved_in,
    )


def _body(
    dialect: Dialect, conv: Conversation, raw: bytes, kept: Kept | None, cap: int | None
) -> bytes:
    """What goes upstream: the client's bytes when nothing was dropped and no cap
    written, else the dialect's render of the kept items."""
    if kept is None:
        return (
            raw
            if cap is None and dialect.forwards_raw
            else dialect.render(conv, range(len(conv.items)), cap)
        )
    shown = conv if kept.shown is None else kept.shown
    if not kept.dropped and cap is None and dialect.forwards_raw and shown is conv:
        return raw
    return dialect.render(shown, kept.result.kept, cap)


@dataclass(frozen=True, slots=True)
class Session:
    """The request's session: its key (None when nothing needs it), and where the
    history the session keeps starts."""

    key: str | None = None
    history_start: int = 0


_NO_SESSION = Session()


async def _session(
    dialect: Dialect,
    conv: Conversation,
    headers: Mapping[str, str],
    svc: Services,
    facts: RequestFacts,
    out: dict[str, str],
    chain: Identity | None,
) -> Session:
    """The session identity, once a request, and the session limits (their headers go in
    ``out``); ``chain``: the session of a stored chain, which the request continues."""
    ident = session_identity(dialect, conv, headers, svc)
    if ident is None:
        return _NO_SESSION
    if chain is not None:
        ident = chain
    if svc.sessions is None or dialect.count_prompts is not None:
        return Session(ident.key)
    view = conv.items if dialect.items_are_messages else session_view(dialect, conv)
    start = await session_step(svc, ident, view, facts, out, dialect.endpoint)
    return Session(ident.key, start)


def _whole(
    dialect: Dialect, count: PromptCount, budget: int | None, svc: Services, session: Session
) -> bool:
    """Whether the prompt goes as it is: it fits whole (a raw prompt is never trimmed,
    only kept whole or refused, by ``_keep``)."""
    if dialect.count_prompts is not None:
        return False
    turns = svc.settings.max_history_turns
    return fits_whole(count.total, budget, turns, session.history_start)


async def _keep(
    dialect: Dialect,
    conv: Conversation,
    count: PromptCount,
    limit: PromptLimit | None,
    session: Session,
    svc: Services,
    metrics: ModelSeries,
    out: dict[str, str],
    facts: RequestFacts,
) -> Kept:
    """What is kept of a prompt that does not fit whole: the trim ladder (old tool
    outputs cleared first, docs/architecture.md §6) or the trim, their drops in the
    metrics; a raw prompt whole or refused."""
    if dialect.count_prompts is not None:
        return Kept(_refused_over(count, limit))
    history_start = session.history_start
    if may_clear(svc, dialect.tool_outputs, conv):
        climbed = await conversation_ladder(
            svc, dialect, conv, count, limit, history_start, metrics, out, facts
        )
        if climbed is not None:  # the ladder notes its own drops
            result, shown = climbed
            dropped = len(conv.items) - len(result.kept)
            return Kept(result, dropped, result.reason if dropped else None, shown=shown)
    policy, result = trim_to(svc.settings, conv.roles, count, limit, history_start)
    # An additive counter's trim is the answer: no coroutine to prove it.
    kept = (
        Kept(result)
        if svc.counter.additive
        else await _proved(dialect, conv, count, policy, history_start, svc, result)
    )
    result = kept.result
    kept.dropped = len(conv.items) - len(result.kept)
    if kept.dropped:
        kept.reason = result.reason or "budget"
        metrics.trimmed(kept.dropped, max(0, count.total - result.tokens), kept.reason)
    return kept


def _count(
    dialect: Dialect, conv: Conversation, raw: bytes, svc: Services, limit: PromptLimit | None
) -> Awaitable[PromptCount]:
    """Every item's tokens as the engine renders them, after the cheap floor: the count
    to await (the counter's own coroutine, so no frame of this one waits across it)."""
    if dialect.count_prompts is not None:
        return dialect.count_prompts(svc, conv, limit)
    # Chat's items are the messages themselves: counted as they are, no view to build
    # (its fast path, docs/performance.md §6).
    view = None if dialect.items_are_messages else dialect.chat_view(conv)
    messages = conv.items if view is None else view.messages
    if limit is not None:
        floor = floor_if_surely_too_long(svc, messages, limit.budget, raw)
        if floor:
            raise context_length_exceeded(floor, limit, at_least=True)
    if view is None:
        return svc.counter.count(messages, tools=conv.tools, model=conv.model)
    return _per_item(svc, dialect, conv, view)


async def _per_item(
    svc: Services, dialect: Dialect, conv: Conversation, view: ChatView
) -> PromptCount:
    """The count of every item: each chat message's tokens go to the item it came from."""
    tools = dialect.tools(conv, range(len(conv.items)))
    counted = await svc.counter.count(view.messages, tools=tools, model=conv.model)
    if view.owner is None:
        return counted
    per = [0] * len(conv.items)
    for j, tokens in enumerate(counted.per_message):
        per[view.owner[j]] += tokens
    return PromptCount(tuple(per), counted.overhead)


def _refused_over(count: PromptCount, limit: PromptLimit | None) -> TrimResult:
    """A raw prompt is kept whole or refused: each prompt within the budget (vLLM runs
    each prompt of a list as a request of its own)."""
    if limit is not None and count.per_message and max(count.per_message) > limit.budget:
        raise context_length_exceeded(max(count.per_message), limit, raw_prompt=True)
    return TrimResult((), count.total, None)


async def _proved(
    dialect: Dialect,
    conv: Conversation,
    count: PromptCount,
    policy: TrimPolicy,
    history_start: int,
    svc: Services,
    result: TrimResult,
) -> Kept:
    """The trim's ``result`` proved to fit by a counter that is not additive
    (``prove_fits``), and the seconds the proof took."""
    began = time.monotonic()
    result = await prove_fits(
        conv.roles, _recount(svc, dialect, conv), count, policy, history_start, result
    )
    return Kept(result, proved_in=time.monotonic() - began)


def _recount(svc: Services, dialect: Dialect, conv: Conversation) -> Recount:
    """The count of kept items as the engine renders them (the dialect's chat view)."""

    async def recount(kept: Sequence[int]) -> int:
        messages, _ = dialect.to_chat(conv, kept)
        tools = dialect.tools(conv, kept)
        return (await svc.counter.count(messages, tools=tools, model=conv.model)).total

    return recount


async def input_tokens(svc: Services, dialect: Dialect, conv: Conversation) -> int:
    """The whole request's prompt tokens, as the engine renders it: what vLLM's
    ``/v1/messages/count_tokens`` answers (its chat conversion and template, tools
    included), from the counter's per-message caches."""
    view = dialect.chat_view(conv)
    tools = dialect.tools(conv, range(len(conv.items)))
    return (await svc.counter.count(view.messages, tools=tools, model=conv.model)).total


def session_view(dialect: Dialect, conv: Conversation) -> list[Message]:
    """The items as the session step hashes them: each one's role for the session limits
    (the dialect's ``session_roles``, else its turn role) and the item."""
    if dialect.session_roles is not None:
        roles = dialect.session_roles(conv)
    else:
        roles = [r["role"] for r in conv.roles]
    return [{"role": r, "content": item} for r, item in zip(roles, conv.items, strict=True)]


def session_identity(
    dialect: Dialect, conv: Conversation, headers: Mapping[str, str], svc: Services
) -> Identity | None:
    """The request's session identity (one hash a request). A raw prompt has no
    conversation to fingerprint and no turns for the session limits: it is routed by a
    session the client names (the session header or ``user``), or not at all."""
    settings = svc.settings
    if dialect.count_prompts is not None:
        if not svc.routes_by_session():
            return None
        if not (headers.get(settings.session_header) or conv.user):
            return None
        return identify(headers, settings.session_header, conv.user, [])
    view = conv.items if dialect.items_are_messages else session_view(dialect, conv)
    return identify(headers, settings.session_header, conv.user, view, dialect.agent_headers)


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


def note_forwarded(
    metrics: ModelSeries, facts: RequestFacts, out: dict[str, str], forwarded: int, dropped: int
) -> None:
    """The forwarded prompt in the metrics, the access line and the response headers."""
    metrics.prompt_forwarded.observe(forwarded)
    facts.prompt_tokens_forwarded, facts.messages_dropped = forwarded, dropped
    out[PROMPT_TOKENS] = str(forwarded)
    out[TRIMMED_MESSAGES] = str(dropped)
