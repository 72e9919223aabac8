"""How far a count was from the upstream's own usage, read as each dialect writes it
(the dialect table's usage readers, docs/architecture.md §22)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import orjson

#: The prompt tokens of an answer's ``usage`` object, as one dialect writes them.
UsageReader = Callable[[Mapping[str, object]], int | None]

# ``"prompt_tokens": 123`` as the last occurrence: the usage object comes after the
# choices in vLLM's and FastChat's responses. A match inside message text would be
# escaped (\"prompt_tokens\"), hence the look-behind.
_PROMPT_TOKENS = re.compile(rb'(?<!\\)"prompt_tokens"\s*:\s*(\d+)')
_TAIL = 4096


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def prompt_tokens(usage: Mapping[str, object]) -> int | None:
    """Chat's and completions' ``usage.prompt_tokens``."""
    value = usage.get("prompt_tokens")
    # The class, not isinstance: a bool is not a count, and chat's every answer reads it.
    return value if value.__class__ is int else None


def input_tokens(usage: Mapping[str, object]) -> int | None:
    """The Responses API's ``usage.input_tokens``."""
    return _int(usage.get("input_tokens"))


def anthropic_input_tokens(usage: Mapping[str, object]) -> int | None:
    """The whole prompt of Anthropic's usage: its ``input_tokens`` leave out what the
    prompt cache read or wrote (``cache_*_input_tokens``)."""
    value = _int(usage.get("input_tokens"))
    if value is None:
        return None
    for key in ("cache_read_input_tokens", "cache_creation_input_tokens"):
        value += _int(usage.get(key)) or 0
    return value


def upstream_prompt_tokens(body: bytes, reader: UsageReader = prompt_tokens) -> int | None:
    """The prompt tokens of a non-streaming response body's usage, read by the
    dialect's ``reader``; None without."""
    if reader is prompt_tokens and len(body) > _TAIL:
        matches = _PROMPT_TOKENS.findall(body[-_TAIL:])
        if matches:
            return int(matches[-1])
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    usage = data.get("usage") if isinstance(data, dict) else None
    return reader(usage) if isinstance(usage, dict) else None


def estimate_error(
    counted: int, response_body: bytes, reader: UsageReader = prompt_tokens
) -> int | None:
    """``counted - usage's prompt tokens`` (positive: we counted more), or None when
    the response carries no usage. Cheap: the tail of a large body is scanned with a
    regex; small bodies are parsed."""
    upstream = upstream_prompt_tokens(response_body, reader)
    return None if upstream is None else counted - upstream
