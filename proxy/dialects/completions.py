"""The legacy completions dialect (``POST /v1/completions``): a raw prompt, no turns.

Nothing is trimmable (``items`` is empty): the prompt is counted whole, capped,
admitted and refused over the budget. ``prompt`` is a string, a list of strings, a
list of token ids or a list of token-id lists; each prompt of a list is a request of
its own to the engine, with ``n`` answers each. vLLM 0.32 has no ``best_of`` (the
field is ignored), and ``echo`` only copies the prompt into the answer (no KV of its
own); ``max_tokens`` 0 is allowed with ``echo`` (score the prompt, generate nothing).
An absent ``max_tokens`` is vLLM's (and FastChat's) 16, a bound like any other; an
explicit ``null`` lets the answer run to the window, as chat's absent one does.
``prompt_embeds`` cannot be counted here and is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from proxy.body import answers, common_fields, load_object, positive_int
from proxy.dialects.conversation import (
    Conversation,
)
from proxy.errors import InvalidRequest
from proxy.types import JSONObject, Message

COMPLETION_FIELD = "max_tokens"
#: vLLM's ``max_tokens`` for a completions request that names none.
DEFAULT_MAX_TOKENS = 16

_PROMPT_HELP = (
    "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists."
)


def parse(raw: bytes) -> Conversation:
    body = load_object(raw, "'model' and 'prompt'")
    model, stream = common_fields(body)
    _check_prompt(body)
    echo = body.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise InvalidRequest("'echo' must be true or false.", param="echo")
    user = body.get("user")
    asked = positive_int(body, COMPLETION_FIELD, zero=bool(echo))
    if COMPLETION_FIELD not in body:
        asked = DEFAULT_MAX_TOKENS
    special = body.get("add_special_tokens")
    if special is not None and not isinstance(special, bool):
        raise InvalidRequest(
            "'add_special_tokens' must be true or false.", param="add_special_tokens"
        )
    truncation(body)
    return Conversation(
        endpoint="completions",
        body=body,
        items=[],
        head=0,
        model=model,
        stream=stream,
        # 0 (with echo) still runs one engine step: vLLM asks for one token.
        max_tokens=1 if asked == 0 else asked,
        user=user if isinstance(user, str) and user else None,
        tools=None,
        n=answers(body),
    )


def _check_prompt(body: JSONObject) -> None:
    prompt = body.get("prompt")
    if body.get("prompt_embeds"):
        raise InvalidRequest(
            "'prompt_embeds' is not served through this proxy: it cannot count embedded "
            "prompts to keep them within the token budget. Send the prompt as text or "
            "token ids.",
            param="prompt_embeds",
        )
    if prompt is None:
        raise InvalidRequest(f"'prompt' is required. {_PROMPT_HELP}", param="prompt")
    if isinstance(prompt, str) or _kind(prompt) is not None:
        return
    raise InvalidRequest(_PROMPT_HELP, param="prompt")


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _kind(prompt: Any) -> str | None:
    """``"texts"``, ``"ids"`` or ``"id_lists"`` for a well-formed list, else None. An
    empty list is token ids, as vLLM reads it."""
    if not isinstance(prompt, list):
        return None
    if all(_is_id(v) for v in prompt):
        return "ids"
    if all(isinstance(v, str) for v in prompt):
        return "texts"
    if all(isinstance(v, list) and all(_is_id(t) for t in v) for v in prompt):
        return "id_lists"
    return None


def prompt_text(conv: Conversation) -> list[str] | None:
    """The prompts as text, one per request the engine runs; None when they are token
    ids (``prompt_ids_lengths``) or embeddings."""
    prompt: Any = conv.body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if _kind(prompt) == "texts":
        return list(prompt)
    return None


def prompt_ids_lengths(conv: Conversation) -> list[int] | None:
    """Each prompt's length where the prompts are token ids (their count is known
    without a tokenizer); None for text."""
    prompt: Any = conv.body.get("prompt")
    kind = _kind(prompt)
    if kind == "ids":
        return [len(prompt)]
    if kind == "id_lists":
        return [len(ids) for ids in prompt]
    return None


def prompt_count(conv: Conversation) -> int:
    """How many prompts (requests to the engine) the body holds."""
    prompt: Any = conv.body.get("prompt")
    return len(prompt) if _kind(prompt) in ("texts", "id_lists") else 1


def special_tokens(conv: Conversation) -> bool:
    """Whether the engine adds the tokenizer's special tokens (BOS) to a text prompt:
    ``add_special_tokens``, true unless the request says false."""
    return conv.body.get("add_special_tokens") is not False


def truncation(body: JSONObject) -> int | None:
    """The tokens the engine cuts each prompt to (``truncate_prompt_tokens``, a vLLM
    extension); None when it does not cut, or cuts to the window (-1: the prompt is
    counted whole, which is never less than what the engine keeps)."""
    value = body.get("truncate_prompt_tokens")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise InvalidRequest(
            "'truncate_prompt_tokens' must be -1 or a non-negative integer.",
            param="truncate_prompt_tokens",
        )
    return None if value == -1 else value


def to_chat(conv: Conversation, kept: Sequence[int]) -> tuple[list[Message], list[int]]:
    """No chat messages: a raw prompt is counted as it is (``prompt_text``)."""
    return [], []


def render(conv: Conversation, kept: Sequence[int], max_tokens: int | None) -> bytes:
    """The body to forward: as it came, with ``max_tokens`` written when given
    (``kept`` is ignored: nothing is trimmable)."""
    body = dict(conv.body)
    if max_tokens is not None:
        body[COMPLETION_FIELD] = max_tokens
    return orjson.dumps(body)
