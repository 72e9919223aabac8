"""The prompt of a Responses or Messages request, once converted to chat messages:
counted, checked against the context window, and planned, the way vLLM 0.32 does it
for those routes.

vLLM renders both through its chat renderer, whose length check
(``renderers/params.py``, ``TokenizeParams._token_len_check``) refuses a prompt longer
than ``max_model_len`` with a ``VLLMValidationError``; then ``get_max_tokens``
(``serve/utils/api_utils.py``) bounds the completion by the room left, never refusing
a ``max_tokens`` that is too large. The chat route of the sim keeps the wording it
mirrors (``vllm.py``); these two routes did not exist in that form before 0.32.
"""

from __future__ import annotations

from typing import Any

from proxy.sim.config import SimConfig
from proxy.sim.dialect import Dialect, Plan, SimError
from proxy.sim.options import ChatOptions
from proxy.sim.tokenizer import prompt_ids, prompt_tokens


def validation_error(
    dialect: Dialect, cfg: SimConfig, message: str, param: str | None, value: Any = None
) -> SimError:
    """A ``VLLMValidationError`` as vLLM's error handler answers it: a 400
    ``BadRequestError`` whose message ends with the parameter and the value refused
    (the exception's ``__str__``)."""
    extras = [f"parameter={param}"] if param is not None else []
    if value is not None:
        extras.append(f"value={value}")
    text = f"{message} ({', '.join(extras)})" if extras else message
    return dialect.error(cfg, 400, text, kind="BadRequestError", param=param)


def count(
    cfg: SimConfig, messages: list[dict[str, Any]], continues: bool = False
) -> tuple[int, list[int] | None]:
    """The prompt's tokens, and its ids when the prefix cache needs them (as chat);
    ``continues``: the final assistant message is continued (no generation prompt)."""
    opens, size = not continues, cfg.bytes_per_token
    if cfg.prefix_caching:
        ids = prompt_ids(messages, add_generation_prompt=opens, bytes_per_token=size)
        return len(ids), ids
    return prompt_tokens(messages, add_generation_prompt=opens, bytes_per_token=size), None


def check_output_bound(dialect: Dialect, cfg: SimConfig, asked: int, param: str) -> None:
    """``TokenizeParams``' refusal of an output bound larger than the whole window,
    before the prompt is even counted (``param`` names the field as vLLM does)."""
    if asked > cfg.max_model_len:
        raise validation_error(
            dialect,
            cfg,
            f"{param}={asked} cannot be greater than max_model_len={cfg.max_model_len}. "
            "Please request fewer output tokens.",
            param,
            asked,
        )


def check_window(dialect: Dialect, cfg: SimConfig, prompt: int) -> None:
    """The renderer's refusal of a prompt longer than the window (one exactly as long
    passes here; each route says what it does with no room left)."""
    limit = cfg.max_model_len
    if prompt > limit:
        raise validation_error(
            dialect,
            cfg,
            f"This model's maximum context length is {limit} tokens. However, your prompt "
            f"contains {prompt} input tokens, which exceeds this limit even without any "
            "output tokens. Please reduce the length of the input prompt.",
            "input_tokens",
            prompt,
        )


def completion_bound(dialect: Dialect, cfg: SimConfig, prompt: int, asked: int | None) -> int:
    """``get_max_tokens``: the room left in the window, or ``asked`` when smaller; 0
    fails ``SamplingParams``' check, as in vLLM."""
    room = cfg.max_model_len - prompt
    bound = room if asked is None else min(room, asked)
    if bound < 1:
        raise validation_error(
            dialect, cfg, f"max_tokens must be at least 1, got {bound}.", "max_tokens", bound
        )
    return bound


def plan(
    cfg: SimConfig,
    model: str,
    prompt: tuple[int, list[int] | None],
    bound: int,
    options: ChatOptions | None = None,
    skip: int = 0,
) -> Plan:
    """The generation: the sim's words up to ``bound``, cut short ("length") when the
    bound is what stops it, as chat plans it; ``skip``: the words the continued
    assistant message already holds, the answer goes on after them."""
    left = max(cfg.completion_tokens - skip, 0)
    tokens = min(left, bound)
    finish = "length" if bound <= left else "stop"
    count_, ids = prompt
    return Plan(model, count_, tokens, finish, options or ChatOptions(), ids, skip=skip)
