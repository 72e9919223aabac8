"""The count of ``POST /v1/completions`` (docs/architecture.md §22): a raw prompt has
no turns to drop, so it is counted exactly and refused over the budget, never forwarded
whole (the prepare step's raw-prompt path, ``Dialect.count_prompts``).

vLLM runs each prompt of a list as a request of its own (``{id}-{i}``), each with its
own ``max_tokens`` clamp against the window: so the budget holds per prompt, and the
KV reservation is the sum of them (``prompts x n`` answers). ``usage.prompt_tokens``
is the sum of the prompts' lengths (``n`` does not multiply it): the count forwarded
is that sum, so the estimate-error metric compares like with like.
"""

from __future__ import annotations

import asyncio

from proxy.dependencies import Services
from proxy.dialects import completions
from proxy.dialects.conversation import Conversation
from proxy.errors import context_length_exceeded
from proxy.floor import floor_over
from proxy.types import PromptCount, PromptLimit


async def count_prompts(
    svc: Services, conv: Conversation, limit: PromptLimit | None
) -> PromptCount:
    """Each prompt's tokens (one per prompt, no overhead), after the cheap floor."""
    if limit is not None:
        _refuse_surely_too_long(svc, conv, limit)
    return PromptCount(tuple(await prompt_tokens(svc, conv)), 0)


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


def _refuse_surely_too_long(svc: Services, conv: Conversation, limit: PromptLimit) -> None:
    """The cheap floor (``proxy.floor``) on each text prompt, before any tokenizer runs."""
    longest = svc.counter.max_token_chars
    if longest is None or completions.truncation(conv.body) is not None:
        return
    for text in completions.prompt_text(conv) or []:
        floor = floor_over([{"role": "user", "content": text}], longest, limit.budget)
        if floor is not None:
            raise context_length_exceeded(floor, limit, at_least=True, raw_prompt=True)
