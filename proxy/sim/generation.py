"""Playing one generation: queue for KV blocks, pace the tokens, notice a client
that leaves, and always give the blocks back.

A client that goes away mid-answer is noticed at once when the server cancels
handlers on disconnect (``serve`` turns that on), else within ``WATCH_INTERVAL``
while waiting or pacing; either way the request's blocks are released at once (as
vLLM aborts the request) and the request is recorded as disconnected.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

from aiohttp import web

from proxy.sim.blocks import block_hashes
from proxy.sim.clock import Clock
from proxy.sim.dialect import Plan
from proxy.sim.kv import Sequence
from proxy.sim.state import RECORD, STATE, SimState
from proxy.sim.tokenizer import answer_ids

T = TypeVar("T")

WATCH_INTERVAL = 0.2
TICK = 0.05
JSON_TYPE = "application/json"
SSE_TYPE = "text/event-stream; charset=utf-8"


class ClientGone(Exception):
    """The client closed the connection before the answer was complete."""


def _check_client(request: web.Request) -> None:
    transport = request.transport
    if transport is None or transport.is_closing():
        raise ClientGone


async def _sleep_watching(request: web.Request, clock: Clock, seconds: float) -> None:
    deadline = clock.monotonic() + seconds
    while True:
        _check_client(request)
        left = deadline - clock.monotonic()
        if left <= 0:
            return
        await clock.sleep(min(left, WATCH_INTERVAL))


async def _watching(request: web.Request, waiting: Awaitable[T]) -> T:
    """Await ``waiting`` (a queue for KV blocks), keeping an eye on the client."""
    task = asyncio.ensure_future(waiting)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=WATCH_INTERVAL)
            if done:
                return task.result()
            _check_client(request)
    finally:
        if not task.done():
            task.cancel()  # the queue gives back anything it took


async def _admit(request: web.Request, state: SimState, plan: Plan) -> Sequence:
    hashes = (
        block_hashes(plan.prompt_ids, state.kv.block_size) if plan.prompt_ids is not None else ()
    )
    seq = state.kv.try_admit(plan.prompt_tokens, plan.completion_tokens, hashes)
    if seq is not None:
        return seq
    return await _watching(
        request, state.kv.admit(plan.prompt_tokens, plan.completion_tokens, hashes)
    )


async def _prefill(request: web.Request, state: SimState, seq: Sequence) -> None:
    """The time the uncached part of the sequence (prompt and, after a preemption,
    what it had generated) takes to compute."""
    uncached = seq.prompt_tokens + seq.generated - seq.hit_tokens
    seconds = state.config.prefill_seconds(uncached)
    if seconds:
        await _sleep_watching(request, state.clock, seconds)


class _Pacer:
    """Generated tokens one decode step at a time; the step grows with the batch, and
    a preempted sequence waits to be recomputed before it goes on."""

    def __init__(self, request: web.Request, state: SimState, seq: Sequence) -> None:
        self.request, self.state, self.seq = request, state, seq
        self.generated = 0

    async def step(self, tokens: int = 1) -> None:
        state = self.state
        interval = state.config.decode_interval(state.kv.num_running)
        if interval:
            await _sleep_watching(self.request, state.clock, interval * tokens)
        self.generated += tokens
        while not state.kv.grow(self.seq, self.generated):
            await _watching(self.request, state.kv.readmit(self.seq))
            await _prefill(self.request, state, self.seq)


#: A request header: the stream breaks off once the answer's K-th token is sent (counted
#: over the whole answer, so a continuation of it goes on past K unbroken); several
#: comma-separated: a continuation breaks off again at the next one.
CUT_HEADER = "x-sim-cut-after"
#: How it breaks off: ``close`` (the connection dropped, as an engine killed mid-answer),
#: ``error`` (vLLM's own error event, then ``[DONE]``) or ``stall`` (nothing more is
#: sent, the connection held open until the client closes it, as a hung engine does).
CUT_HOW_HEADER = "x-sim-cut"
_ERROR_EVENT = (
    b'data: {"error": {"message": "EngineCore encountered an issue.", "type": '
    b'"InternalServerError", "param": null, "code": 500}}\n\ndata: [DONE]\n\n'
)


def _cut_at(request: web.Request) -> frozenset[int]:
    values = request.headers.get(CUT_HEADER, "").split(",")
    return frozenset(int(v) for v in values if v.strip().isdigit())


async def _break_off(request: web.Request, response: web.StreamResponse) -> None:
    how = request.headers.get(CUT_HOW_HEADER)
    if how == "error":
        await response.write(_ERROR_EVENT)
        await response.write_eof()
        return
    if how == "stall":
        # Raises ClientGone once the client closes the connection.
        await _sleep_watching(request, request.app[STATE].clock, 24 * 3600.0)
    if request.transport is not None:
        request.transport.abort()
    raise ClientGone  # the sim's own cleanup: the blocks go back


def _tail_hashes(state: SimState, plan: Plan, generated: int) -> list[int]:
    if plan.answer is None or plan.prompt_ids is None or generated != plan.completion_tokens:
        return []
    ids = answer_ids(plan.prompt_ids, plan.answer, state.config.bytes_per_token)
    return block_hashes(ids, state.kv.block_size)


async def generate(
    request: web.Request,
    plan: Plan,
    stream_events: Iterator[bytes] | None,
    full_body: Callable[[], bytes],
) -> web.StreamResponse:
    """Hold KV blocks while "generating" ``plan.completion_tokens`` at the configured
    pace, then answer with ``full_body()``, or stream ``stream_events``: the first
    event once the prompt is prefilled, then one event per generated token, then the
    rest."""
    state = request.app[STATE]
    cfg = state.config
    clock = state.clock
    received = clock.monotonic()
    record = request.get(RECORD)
    if record is not None:
        record.prompt_tokens = plan.prompt_tokens
        record.stream = stream_events is not None
    seq: Sequence | None = None
    pacer: _Pacer | None = None
    response: web.StreamResponse | None = None
    gone = False
    try:
        if cfg.delay_seconds:
            await _sleep_watching(request, clock, cfg.delay_seconds)
        seq = await _admit(request, state, plan)
        state.prompt_tokens_total += plan.prompt_tokens
        plan.cached_tokens = seq.hit_tokens
        if record is not None:
            record.cached_tokens = seq.hit_tokens
        await _prefill(request, state, seq)
        if record is not None:
            record.ttft_seconds = clock.monotonic() - received
        pacer = _Pacer(request, state, seq)
        if stream_events is None:
            # A tick every TICK seconds at most: the KV curve still grows smoothly.
            interval = cfg.decode_interval(state.kv.num_running)
            per_tick = max(1, int(TICK / interval)) if interval else plan.completion_tokens
            while pacer.generated < plan.completion_tokens:
                await pacer.step(min(per_tick, plan.completion_tokens - pacer.generated))
            response = web.Response(body=full_body(), content_type=JSON_TYPE)
        else:
            response = web.StreamResponse(headers={"Content-Type": SSE_TYPE})
            await response.prepare(request)
            events = iter(stream_events)
            await response.write(next(events))  # the role chunk, with the first token
            cut = _cut_at(request)
            for k in range(plan.completion_tokens):
                await pacer.step()
                await response.write(next(events))
                if plan.skip + k + 1 in cut:
                    await _break_off(request, response)
                    return response
            for event in events:
                await response.write(event)
            await response.write_eof()
        state.completed += 1
        return response
    except (ClientGone, ConnectionResetError):
        gone = True
        # Nothing more reaches the client; whatever aiohttp does with this, nobody reads it.
        return response if response is not None else web.Response(status=499)
    except asyncio.CancelledError:
        gone = True  # the server cancels the handler when its client leaves
        raise
    finally:
        generated = pacer.generated if pacer is not None else 0
        if gone:
            state.disconnects += 1
            if record is not None:
                record.disconnected = True
        if record is not None:
            record.completion_tokens = generated
            record.preemptions = seq.preemptions if seq is not None else 0
        state.generation_tokens_total += generated
        if seq is not None:
            state.kv.release(seq, _tail_hashes(state, plan, generated))
