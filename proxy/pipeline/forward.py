"""The forward step: a request to its engine, and what its answer holds until it ends.

``forward`` sends one request and returns a ``Sent``: the engine's response head and
everything the answer's end must settle (the relay's one hook, ``proxy.pipeline.relay.Answer``).
A prepared request (one that carries a prompt) is routed, admitted and sent:

- the lone engine of an upstream without a KV gate (``Upstream.lone``) is sent to
  directly: no order, weight, reservation or in-flight count to keep
  (docs/architecture.md §20);
- else the first engine of the request's order (``Upstream.order``: the session's
  rendezvous order under ``TRIMPROXY_ROUTING=session``) reserves on its own KV gate and
  waits for that engine (never spills to another while it only waits: that would cost
  the turn its prefix hits), and is sent to; when its connection fails before anything
  was sent, the next engine of the order gets it (``failover``).

A request that carries no prompt (``prepared`` None: embeddings, the model list, ...)
goes to the rotation's first engine, with the same failover. Whatever fails, the
client's disconnect watcher is cancelled here, the one place that owns it until the
relay takes it over.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import aiohttp

from proxy.admission import AnswerWatch, KvAdmission, Need, Reservation, asks_usage, wait_header
from proxy.dependencies import Services
from proxy.engines.engine import Engine
from proxy.errors import ProxyError
from proxy.logs import RequestFacts
from proxy.metrics import Metrics
from proxy.pipeline.breakoff import FailureMap
from proxy.pipeline.continuation import CHAT, Continuation, Form, SoFar
from proxy.pipeline.prepare import Prepared
from proxy.pipeline.relay import ChunkHook
from proxy.tokens import estimate_error
from proxy.upstream import unanswered
from proxy.upstream.failover import failover


@dataclass(slots=True)
class Outgoing:
    """What goes upstream: the method, the path in normal form (with the query), the
    headers (``Upstream.request_headers``) and the body."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes | None


# Not frozen: read-only by convention but for what the answer's end settles (why:
# proxy.types, above PromptCount).
@dataclass(slots=True)
class Sent:
    """A forwarded request: the engine's response head, and what its answer holds."""

    response: aiohttp.ClientResponse
    headers: Mapping[str, str]
    """Response headers the proxy adds (token counts, session, admission wait)."""
    failure: FailureMap
    """The error for an answer that broke off mid-body (``Transport.failure``)."""
    prepared: Prepared | None = None
    metrics: Metrics | None = None
    facts: RequestFacts | None = None
    started: float = 0.0
    """``perf_counter()`` when it was forwarded (the TTFB clock)."""
    engine: Engine | None = None
    """The engine whose in-flight count this answer holds (None: the lone engine's)."""
    reservation: Reservation | None = None
    watch: AnswerWatch | None = None
    """An answer that may outgrow its reservation (``proxy.admission.overrun``)."""
    on_chunk: ChunkHook | None = None
    continuation: Continuation | None = None
    """A streamed answer that may go on on another engine (``proxy.pipeline.continuation``)."""
    on_first_byte: Callable[[], None] | None = None
    """The relay's first-byte hook: ``first_byte`` for a prepared request, else None.
    An attribute set where a prepared request's ``Sent`` is built, not a property: the
    relay reads it on every request."""
    _done: bool = False

    def first_byte(self) -> None:
        assert self.facts is not None and self.metrics is not None
        self.facts.upstream_ttfb = time.perf_counter() - self.started
        # Under the route the prompt came by (a Responses answer is not chat's).
        series = self.prepared.series if self.prepared is not None else None
        ttfb = self.metrics.chat_ttfb if series is None else series.ttfb
        ttfb.observe(self.facts.upstream_ttfb)

    def end(self, complete: bool, captured: bytes | None) -> None:
        """The answer is over, however it ended: give back what it held, and compare
        the engine's usage with the count (idempotent)."""
        if self._done:
            return
        self._done = True
        # The first-byte hook (a method of this answer) and the continuation's move (a
        # closure over it) are cycles: broken here, the answer and the prepared request
        # it holds (the parsed prompt, megabytes for a long one) go when the relay
        # drops them, not at the next collection (tests/chains/test_hostile_store.py).
        self.on_first_byte = None
        self.continuation = None
        if self.watch is not None:
            self.watch.finish(captured)
        if self.engine is not None:
            self.engine.in_flight -= 1
        if self.reservation is not None:
            self.reservation.release()
        prepared = self.prepared
        if captured is not None and prepared is not None and self.response.status == 200:
            error = estimate_error(prepared.forwarded_tokens, captured, prepared.dialect.usage)
            if error is not None:
                prepared.series.estimate_error.observe(error)


async def forward(
    svc: Services,
    out: Outgoing,
    client_gone: asyncio.Future[None],
    facts: RequestFacts,
    prepared: Prepared | None = None,
) -> Sent:
    """Send ``out`` (the ``prepared`` request's, when it carries a prompt) to its engine;
    cancels ``client_gone`` when that fails."""
    try:
        if prepared is None:
            upstream = svc.upstream
            response = await upstream.forward(
                out.method, out.path, out.headers, out.body, client_gone
            )
            return Sent(response=response, headers={}, failure=upstream.transport.failure)
        lone = svc.upstream.lone
        if lone is None or lone in svc.gates:
            return await _send_routed(svc, out, client_gone, facts, prepared)
        # Inline, not a coroutine of its own: the common deployment's every request.
        transport = svc.upstream.transport
        facts.engine = lone.label
        started = time.perf_counter()
        response = await transport.send(
            lone, out.method, out.path, out.headers, out.body, client_gone, prepared.counted_in
        )
        return _prepared_sent(svc, response, prepared, facts, started)
    except BaseException:
        client_gone.cancel()
        raise


def _prepared_sent(
    svc: Services,
    response: aiohttp.ClientResponse,
    prepared: Prepared,
    facts: RequestFacts,
    started: float,
    engine: Engine | None = None,
    reservation: Reservation | None = None,
) -> Sent:
    """A prepared request's answer, its first-byte hook set (the lone engine's and a
    routed one's alike)."""
    sent = Sent(
        response=response,
        headers=prepared.headers,
        failure=svc.upstream.transport.failure,
        prepared=prepared,
        metrics=svc.metrics,
        facts=facts,
        started=started,
        engine=engine,
        reservation=reservation,
    )
    sent.on_first_byte = sent.first_byte
    return sent


async def _send_routed(
    svc: Services,
    out: Outgoing,
    client_gone: asyncio.Future[None],
    facts: RequestFacts,
    prepared: Prepared,
) -> Sent:
    """Routed, admitted on its engine's gate, sent; failed over once on a refusal."""
    upstream = svc.upstream
    transport = upstream.transport
    gates = svc.gates
    allowance = prepared.allowance
    # The most KV this request can hold: its prompt and n whole completions.
    need = Need(prepared.forwarded_tokens, allowance.tokens, allowance.n)
    key = prepared.session_key
    endpoint = prepared.endpoint

    async def attempt(engine: Engine, body: bytes | None = out.body) -> Sent:
        gate = gates.get(engine)
        reservation = None
        facts.engine = engine.label
        if gate is not None:
            reservation = await gate.admit_while_connected(need, client_gone, endpoint)
        engine.in_flight += 1
        started = time.perf_counter()
        try:
            # A continuation's count was long ago: its read timeout is whole.
            spent = prepared.counted_in if body is out.body else 0.0
            response = await transport.send(
                engine, out.method, out.path, out.headers, body, client_gone, spent
            )
        except BaseException:
            engine.in_flight -= 1
            if reservation is not None:
                reservation.release()
            raise
        sent = _prepared_sent(svc, response, prepared, facts, started, engine, reservation)
        if gate is not None and reservation is not None:
            _watch(sent, gate, reservation, need, prepared)
        return sent

    order = upstream.order(key)
    sent, engine = await failover(order, attempt, unanswered)
    if engine is not order[0]:
        upstream.router.retried(key, engine)
    form = _continuable(svc, out, prepared, sent)
    if form is not None:
        _continue_on(svc, out, prepared, sent, attempt, form)
    return sent


def _continuable(svc: Services, out: Outgoing, prepared: Prepared, sent: Sent) -> Form | None:
    """The continuation form of a streamed answer that has another engine to go on
    on: chat's of one choice without logprobs, or the Responses dialect's (whose
    stream says what it holds, ``ResponsesPartial``) (docs/architecture.md §23)."""
    form = prepared.dialect.form
    if form is None or out.body is None or sent.response.status != 200:
        return None
    if svc.settings.continue_attempts < 1 or len(svc.upstream.engines.all()) < 2:
        return None
    request = prepared.request
    if form is not CHAT:
        return form if request.stream else None
    if not request.stream or request.n != 1:
        return None
    body = request.body
    return None if body.get("logprobs") or body.get("top_logprobs") else form


def _continue_on(
    svc: Services,
    out: Outgoing,
    prepared: Prepared,
    sent: Sent,
    attempt: Callable[[Engine, bytes], Awaitable[Sent]],
    form: Form,
) -> None:
    """Make ``sent`` continuable: its chunks kept, and the move to the next engine."""
    upstream = svc.upstream
    key = prepared.session_key
    model = prepared.request.model
    tried: list[Engine] = [] if sent.engine is None else [sent.engine]
    so_far = SoFar(sent.on_chunk, form.partial())

    async def move(body: bytes) -> tuple[aiohttp.ClientResponse, str] | str:
        if not await _continues_chat(svc, model):
            return "the engines have no continuation form (FastChat)"
        # What the broken answer held on its engine is given back at once.
        if sent.engine is not None:
            sent.engine.in_flight -= 1
            sent.engine = None
        if sent.reservation is not None:
            sent.reservation.release()
            sent.reservation = None
        sent.watch = None
        try:
            order = [e for e in upstream.order(key) if e not in tried]
        except ProxyError as exc:
            return exc.message
        if not order:
            return "no other live engine"
        try:
            moved, engine = await failover(order, lambda e: attempt(e, body), unanswered)
        except ProxyError as exc:
            return f"it could not be sent: {exc.message}"
        tried.append(engine)
        upstream.router.retried(key, engine)
        sent.engine, sent.reservation, sent.watch = moved.engine, moved.reservation, moved.watch
        so_far.then = moved.on_chunk
        if moved.response.status != 200:
            moved.response.close()
            return f"{engine.label} refused it with status {moved.response.status}"
        return moved.response, engine.label

    assert sent.facts is not None
    sent.continuation = Continuation(
        body=out.body or b"",
        attempts=svc.settings.continue_attempts,
        move=move,
        so_far=so_far,
        metrics=svc.metrics,
        facts=sent.facts,
        form=form,
    )
    sent.on_chunk = so_far.on_chunk


async def _continues_chat(svc: Services, model: str | None) -> bool:
    """Whether the engines can continue a final assistant message: vLLM can, and lists
    ``max_model_len`` for its models; FastChat lists none and cannot."""
    try:
        served = await svc.upstream.models()
    except ProxyError:
        return False
    named = [m for m in served if m.id == model] or served
    return bool(named) and all(m.max_model_len is not None for m in named)


def _watch(
    sent: Sent, gate: KvAdmission, reservation: Reservation, need: Need, prepared: Prepared
) -> None:
    """The admission wait in the headers; a watch on an answer told no limit, which the
    engine may let outgrow its reservation."""
    sent.headers = {**sent.headers, **wait_header(reservation)}
    allowance = prepared.allowance
    if allowance.bounded or not reservation.charge:
        return
    request = prepared.request
    stream = request.stream
    usage = stream and asks_usage(request.body)
    sent.watch = AnswerWatch(gate, reservation, need, stream, usage, prepared.dialect.answer)
    if stream:
        sent.on_chunk = sent.watch.on_chunk
