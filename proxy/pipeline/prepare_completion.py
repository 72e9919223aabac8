"""The prepare step of ``POST /v1/completions`` (docs/architecture.md §22): a raw
prompt has no turns to drop, so it is counted exactly, capped, admitted, routed and
measured like chat, and refused over the budget, never forwarded whole.

vLLM runs each prompt of a list as a request of its own (``{id}-{i}``), each with its
own ``max_tokens`` clamp against the window: so the budget holds per prompt, and the
KV reservation is the sum of them (``prompts x n`` answers). ``usage.prompt_tokens``
is the sum of the prompts' lengths (``n`` does not multiply it): the count forwarded
is that sum, so the estimate-error metric compares like with like.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import replace

from proxy.dependencies import Services
from proxy.dialects import completions
from proxy.dialects.conversation import Conversation
from proxy.errors import context_length_exceeded
from proxy.floor import floor_over
from proxy.logs import RequestFacts
from proxy.pipeline.prepare import (
    Prepared,
    completion_allowance,
    limit_for,
    model_series,
    note_forwarded,
    note_model,
    written_cap,
)
from proxy.sessions.identity import identify
from proxy.types import PromptLimit


async def prompt_tokens(svc: Services, conv: Conversation) -> list[int]:
    """Each prompt's tokens as the engine counts them: text encoded by the counter
    (special tokens added unless ``add_special_tokens`` is false), token ids as they
    are; cut to ``truncate_prompt_tokens`` when the request asks the engine to."""
    lengths = completions.prompt_ids_lengths(conv)
    if lengths is None:
        texts = completions.prompt_text(conv) or []
        special = completions.special_tokens(conv)
        count = svc.counter.count_prompt
        lengths = list(
            await asyncio.gather(
                *(count(t, model=conv.model, special_tokens=special) for t in texts)
            )
        )
    keep = completions.truncation(conv.body)
    return lengths if keep is None else [min(n, keep) for n in lengths]


def _route_key(svc: Services, headers: Mapping[str, str], conv: Conversation) -> str | None:
    """The session to route by, over several engines with ``routing: session``: only
    one the client names (the session header or ``user``); a raw prompt has no
    conversation to fingerprint, and no turns for the session limits."""
    settings = svc.settings
    if settings.routing != "session" or len(svc.upstream.engines.live()) < 2:
        return None
    if not (headers.get(settings.session_header) or conv.user):
        return None
    return identify(headers, settings.session_header, conv.user, []).key


def _refuse_surely_too_long(svc: Services, conv: Conversation, limit: PromptLimit) -> None:
    """The cheap floor (``proxy.floor``) on each text prompt, before any tokenizer runs."""
    longest = svc.counter.max_token_chars
    if longest is None or completions.truncation(conv.body) is not None:
        return
    for text in completions.prompt_text(conv) or []:
        floor = floor_over([{"role": "user", "content": text}], longest, limit.budget)
        if floor is not None:
            raise context_length_exceeded(floor, limit, at_least=True, raw_prompt=True)


async def prepare_completion(
    conv: Conversation, raw: bytes, headers: Mapping[str, str], svc: Services,
    facts: RequestFacts,
) -> Prepared:  # fmt: skip
    """Count, cap, budget of a completions request: what to forward, or the refusal."""
    note_model(svc.settings.max_model_name_length, conv.model, facts, "completions")
    out: dict[str, str] = {}
    allowance = completion_allowance(svc, conv)
    cap = written_cap(allowance, out)
    limit = await limit_for(svc, conv, allowance)
    if limit is not None:
        _refuse_surely_too_long(svc, conv, limit)
    began = time.monotonic()
    counts = await prompt_tokens(svc, conv)
    counted_in = time.monotonic() - began
    total = sum(counts)
    metrics = await model_series(svc, conv.model, "completions")
    metrics.prompt_received.observe(total)
    facts.prompt_tokens_received = total
    if limit is not None and counts and max(counts) > limit.budget:
        raise context_length_exceeded(max(counts), limit, raw_prompt=True)
    body = raw if cap is None else completions.render(conv, (), cap)
    note_forwarded(metrics, facts, out, total, 0)
    prompts = completions.prompt_count(conv)
    return Prepared(
        body=body, received_tokens=total, forwarded_tokens=total, dropped=0,
        trim_reason=None, budget=None if limit is None else limit.budget, headers=out,
        session_id=None, reserve=allowance.tokens,
        allowance=replace(allowance, n=allowance.n * prompts), series=metrics,
        session_key=_route_key(svc, headers, conv), counted_in=counted_in, stream=conv.stream,
    )  # fmt: skip
