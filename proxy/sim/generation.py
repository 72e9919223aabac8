"""Playing one generation: queue for KV blocks, pace the tokens, notice a client
that leaves, and always give the blocks back.

A client that goes away mid-answer is noticed at once when the server cancels
handlers on disconnect (``serve`` turns that on), else within ``WATCH_INTERVAL``
while waiting or pacing; either way the request's blocks are released at once (as
vLLM aborts the request) and the request is recorded as disconnected.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

from aiohttp import web

from proxy.sim.dialect import Plan
from proxy.sim.kv import Sequence
from proxy.sim.state import RECORD, STATE, SimState

WATCH_INTERVAL = 0.2
JSON_TYPE = "application/json"
SSE_TYPE = "text/event-stream; charset=utf-8"


class ClientGone(Exception):
    """The client closed the connection before the answer was complete."""


def _check_client(request: web.Request) -> None:
    transport = request.transport
    if transport is None or transport.is_closing():
        raise ClientGone


async def _sleep_watching(request: web.Request, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        _check_client(request)
        left = deadline - time.monotonic()
        if left <= 0:
            return
        await asyncio.sleep(min(left, WATCH_INTERVAL))


async def _admit(request: web.Request, state: SimState, plan: Plan) -> Sequence:
    seq = state.kv.try_admit(plan.prompt_tokens, plan.completion_tokens)
    if seq is not None:
        return seq
    # Queued behind others: wait, but keep an eye on the client meanwhile.
    task = asyncio.ensure_future(state.kv.admit(plan.prompt_tokens, plan.completion_tokens))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=WATCH_INTERVAL)
            if done:
                return task.result()
            _check_client(request)
    finally:
        if not task.done():
            task.cancel()  # admit() gives back anything it took


async def generate(
    request: web.Request,
    plan: Plan,
    stream_events: Iterator[bytes] | None,
    full_body: Callable[[], bytes],
) -> web.StreamResponse:
    """Hold KV blocks while "generating" ``plan.completion_tokens`` at the configured
    pace, then answer with ``full_body()``, or stream ``stream_events``: the first
    event at once, then one event per generated token, then the rest."""
    state = request.app[STATE]
    cfg = state.config
    record = request.get(RECORD)
    if record is not None:
        record.prompt_tokens = plan.prompt_tokens
        record.stream = stream_events is not None
    seq: Sequence | None = None
    generated = 0
    response: web.StreamResponse | None = None
    gone = False
    try:
        if cfg.delay_seconds:
            await _sleep_watching(request, cfg.delay_seconds)
        seq = await _admit(request, state, plan)
        state.prompt_tokens_total += plan.prompt_tokens
        tps = cfg.tokens_per_second
        start = time.monotonic()
        if stream_events is None:
            if tps > 0:
                end = start + plan.completion_tokens / tps
                while generated < plan.completion_tokens:
                    # Tick often enough that the KV curve grows smoothly.
                    await _sleep_watching(request, min(end - time.monotonic(), 0.05))
                    elapsed = time.monotonic() - start
                    generated = min(plan.completion_tokens, int(elapsed * tps + 1e-9))
                    state.kv.grow(seq, generated)
            generated = plan.completion_tokens
            state.kv.grow(seq, generated)
            response = web.Response(body=full_body(), content_type=JSON_TYPE)
        else:
            response = web.StreamResponse(headers={"Content-Type": SSE_TYPE})
            await response.prepare(request)
            events = iter(stream_events)
            await response.write(next(events))  # the role chunk: first byte at once
            for _ in range(plan.completion_tokens):
                if tps > 0:
                    due = start + (generated + 1) / tps
                    await _sleep_watching(request, due - time.monotonic())
                generated += 1
                state.kv.grow(seq, generated)
                await response.write(next(events))
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
        if gone:
            state.disconnects += 1
            if record is not None:
                record.disconnected = True
        if record is not None:
            record.completion_tokens = generated
        state.generation_tokens_total += generated
        if seq is not None:
            state.kv.release(seq)
