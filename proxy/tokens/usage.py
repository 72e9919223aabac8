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
    """``usage.prompt_tokens`` of a non-streaming response body, or None."""
    if len(body) > _TAIL:
        matches = _PROMPT_TOKENS.findall(body[-_TAIL:])
        if matches:
            return int(matches[-1])
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    usage = data.get("usage") if isinstance(data, dict) else None
    value = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def estimate_error(counted: int, response_body: bytes) -> int | None:
    """``counted - usage.prompt_tokens`` (positive: we counted more), or None when
    the response carries no usage. Cheap: the tail of a large body is scanned with a
    regex; small bodies are parsed."""
    upstream = upstream_prompt_tokens(response_body)
    return None if upstream is None else counted - upstream
