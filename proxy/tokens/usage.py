"""How far a count was from the upstream's own ``usage.prompt_tokens``."""

from __future__ import annotations

import re

import orjson

# ``"prompt_tokens": 123`` as the last occurrence: the usage object comes after the
# choices in vLLM's and FastChat's responses. A match inside message text would be
# escaped (\"prompt_tokens\"), hence the look-behind.
_PROMPT_TOKENS = re.compile(rb'(?<!\\)"prompt_tokens"\s*:\s*(\d+)')
_TAIL = 4096


def upstream_prompt_tokens(body: bytes) -> int | None:
    """The prompt tokens of a non-streaming response body's usage (any dialect's), or
    None."""
    if len(body) > _TAIL:
        matches = _PROMPT_TOKENS.findall(body[-_TAIL:])
        if matches:
            return int(matches[-1])
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens")  # chat's and completions'
    if prompt is None:
        return _input_tokens(usage)
    return prompt if isinstance(prompt, int) and not isinstance(prompt, bool) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _input_tokens(usage: dict[str, object]) -> int | None:
    """The whole prompt of the dialects' usage: the Responses API's ``input_tokens``,
    or Anthropic's, whose ``input_tokens`` leave out what the prompt cache read or
    wrote (``cache_*_input_tokens``)."""
    value = _int(usage.get("input_tokens"))
    if value is None:
        return None
    for key in ("cache_read_input_tokens", "cache_creation_input_tokens"):
        value += _int(usage.get(key)) or 0
    return value


def estimate_error(counted: int, response_body: bytes) -> int | None:
    """``counted - usage.prompt_tokens`` (positive: we counted more), or None when
    the response carries no usage. Cheap: the tail of a large body is scanned with a
    regex; small bodies are parsed."""
    upstream = upstream_prompt_tokens(response_body)
    return None if upstream is None else counted - upstream
