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
# escaped (\"prompt_tokens\"): one right after a backslash is not taken (``_last``).
# Each pattern starts with its literal, which ``re`` looks for at C speed; a
# look-behind in front made it try every byte, some 170 instructions a byte of the
# tail (docs/performance.md §5b).
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
# The Responses API's usage opens with ``input_tokens`` (OpenAI's ``ResponseUsage``,
# which vLLM answers with), and the response object is read from any size: parsing
# it whole was most of the cost of reading its usage.
_RESPONSES_INPUT_TOKENS = re.compile(rb'"usage"\s*:\s*\{\s*"input_tokens"\s*:\s*(\d+)')
_TAIL = 4096
_BACKSLASH = ord("\\")


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
        found = _last(_PROMPT_TOKENS, body[-_TAIL:])
        if found is not None:
            return found
    elif reader is input_tokens:
        found = _last(_RESPONSES_INPUT_TOKENS, body)
        if found is not None:
            return found
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    usage = data.get("usage") if isinstance(data, dict) else None
    return reader(usage) if isinstance(usage, dict) else None


def _last(pattern: re.Pattern[bytes], text: bytes) -> int | None:
    """The number of the last match of ``pattern`` in ``text`` that no backslash
    escapes (one inside a JSON string is escaped); None without one."""
    found = None
    for match in pattern.finditer(text):
        start = match.start()
        if start == 0 or text[start - 1] != _BACKSLASH:
            found = match
    return None if found is None else int(found.group(1))


def estimate_error(
    counted: int, response_body: bytes, reader: UsageReader = prompt_tokens
) -> int | None:
    """``counted - usage's prompt tokens`` (positive: we counted more), or None when
    the response carries no usage. Cheap: the tail of a large chat body and a whole
    Responses body are scanned with a regex; the rest is parsed."""
    upstream = upstream_prompt_tokens(response_body, reader)
    return None if upstream is None else counted - upstream
