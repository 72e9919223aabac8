"""A conservative token estimate that needs no tokenizer.

A flat ``chars / 3`` is wrong both ways: about 47% high on English and 37% low on
Chinese. Scripts tokenize very differently, so each is weighed on its own: Latin
text at 3.5 characters a token (3.2 when mixed with other scripts), CJK at 1.3
tokens a character, other non-ASCII scripts at two characters a token, digits at
one token each (Llama and DeepSeek split numbers into digits). Each weight sits at
the pessimistic end of the common BPE vocabularies (cl100k, Llama, Qwen, DeepSeek;
``tests/tokens/test_approx_bound.py`` checks it), so the estimate is an upper bound
in practice, never exact.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from proxy.tokens.cache import ByteLRU
from proxy.types import JSONObject, Message, PromptCount

_CJK = re.compile(
    "[\u1100-\u11ff\u2e80-\u2fdf\u3000-\u303f\u3040-\u30ff\u3100-\u312f\u3130-\u318f"
    "\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]"
)
# Counting by deleting bytes is a C loop over the UTF-8 encoding: several times
# cheaper than a regex findall, which builds a list of one-character strings.
_DIGITS = b"0123456789"
_HIGH = bytes(range(128, 256))
# cl100k spends about 1.2 tokens on a Chinese character, Llama 3 about 1.1, Qwen
# about 0.7: the bound takes the high end.
_CJK_WEIGHT = 1.3
_CACHE_BYTES = 16 * 1024 * 1024

# Chat-format framing per message (<|im_start|>role\n ... <|im_end|>\n and the like)
# and the generation prompt that opens the answer.
MESSAGE_OVERHEAD = 6
REPLY_PRIMING = 4
# What a tokenizer may add around a raw prompt (BOS, EOS): a bound takes both.
SPECIAL_TOKENS = 2
# Images are counted by the model's vision encoder; no text estimate can know them.
IMAGE_TOKENS = 1024


def estimate_text(text: str) -> int:
    if not text:
        return 0
    raw = text.encode("utf-8", "surrogatepass")
    digits = len(raw) - len(raw.translate(None, _DIGITS))
    if len(raw) == len(text):
        return math.ceil((len(text) - digits) / 3.5 + digits)
    non_ascii = len(text) - len(raw.translate(None, _HIGH))
    cjk = len(_CJK.findall(text))
    latin = len(text) - non_ascii - digits
    return math.ceil(latin / 3.2 + digits + cjk * _CJK_WEIGHT + (non_ascii - cjk) / 2)


def _content_tokens(content: Any, text: Callable[[str], int]) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return text(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    total += text(part["text"])
                elif part.get("type") in ("image_url", "input_image", "image"):
                    total += IMAGE_TOKENS
                else:
                    total += text(orjson.dumps(part).decode())
            elif isinstance(part, str):
                total += text(part)
        return total
    return text(orjson.dumps(content).decode())


def estimate_message(message: Message, text: Callable[[str], int] = estimate_text) -> int:
    """A message's tokens: its framing and every text in it, each estimated by ``text``
    (the counter puts its cache in front of ``estimate_text``)."""
    return MESSAGE_OVERHEAD + _content_tokens(message.get("content"), text) + _other(message, text)


def _other(message: Message, text: Callable[[str], int]) -> int:
    """The tokens of a message's texts beside its content: its calls, name, ids."""
    tokens = 0
    for key in ("tool_calls", "function_call"):
        value = message.get(key)
        if value:
            tokens += text(orjson.dumps(value).decode())
    for key in ("name", "tool_call_id", "reasoning_content"):
        value = message.get(key)
        if isinstance(value, str):
            tokens += text(value)
    return tokens


def _through(texts: ByteLRU[str, int], fresh: list[tuple[str, int]]) -> Callable[[str], int]:
    """``estimate_text`` behind ``texts``: a text seen before is looked up (a hit), a new
    one estimated and added to ``fresh``, which the count puts in at its end."""
    lookup, touch = texts.lookups()

    def cached(text: str) -> int:
        tokens = lookup(text)
        if tokens is None:
            tokens = estimate_text(text)
            fresh.append((text, tokens))
        else:
            touch(text)
            texts.hits += 1
        return tokens

    return cached


class ApproxCounter:
    """The ``approx`` backend: a bound, not a count."""

    name = "approx"
    exact = False
    additive = True
    #: No estimate here gives a token more than 3.5 characters: the cheap floor
    #: (``proxy.pipeline.prepare``) may count on it.
    max_token_chars = 4

    def __init__(self, cache_bytes: int = _CACHE_BYTES) -> None:
        self._texts: ByteLRU[str, int] = ByteLRU(cache_bytes)

    async def count(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[JSONObject] | None = None,
        model: str | None = None,
    ) -> PromptCount:
        # Every request, every message: one loop with everything bound once, and on
        # the common message (role and a text) no Python call but the estimate of a
        # text not seen before. Every text is kept (tool outputs, calls' JSON, ids
        # too): clients resend the history, and a fresh string's hash and lookup cost
        # a sixth of its estimate (docs/performance.md §6). The framing is added here.
        texts = self._texts
        lookup, touch = texts.lookups()
        estimate = estimate_text
        other = _other
        framing = MESSAGE_OVERHEAD
        per_message: list[int] = []
        append = per_message.append
        fresh: list[tuple[str, int]] = []
        hits = 0
        # The other messages' texts (and the tools') through the cache, the function
        # built once a count and only when one is met: a closure here would make the
        # loop's names cells, which the plain loop would pay for on every message.
        cached: Callable[[str], int] | None = None
        overhead = REPLY_PRIMING
        if tools:  # an agent sends the same tools, often tens of kB, on every turn
            cached = _through(texts, fresh)
            overhead += cached(orjson.dumps(list(tools)).decode())
        for message in messages:
            content = message.get("content")
            # A text content, the common one, looked up here without a call: a plain
            # message (role and text) needs nothing more, any other the texts beside
            # it. Plain str only: what JSON gives; a subclass goes the long way, to
            # the same estimate.
            if content.__class__ is str:
                tokens = lookup(content)
                if tokens is None:
                    tokens = estimate(content)
                    fresh.append((content, tokens))
                else:
                    touch(content)
                    hits += 1
                if len(message) == 2 and "role" in message:
                    append(framing + tokens)
                    continue
                # A tool output, a named message: the texts beside the content.
                if cached is None:
                    cached = _through(texts, fresh)
                append(framing + tokens + other(message, cached))
                continue
            if cached is None:
                cached = _through(texts, fresh)
            append(estimate_message(message, cached))
        if fresh:
            texts.put_many(fresh)
        texts.hits += hits
        return PromptCount(tuple(per_message), overhead)

    async def count_prompt(
        self, text: str, *, model: str | None = None, special_tokens: bool = True
    ) -> int:
        return estimate_text(text) + (SPECIAL_TOKENS if special_tokens else 0)

    async def aclose(self) -> None:
        return None
