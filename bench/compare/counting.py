"""The one token counter every trimmer in the comparison is judged by.

A comparison of trimmers is only fair when "over budget" means the same thing for
all of them, so one counter defines it: the OpenAI chat framing over a text
tokenizer (3 tokens a message, the role, the content, ``name`` + 1, the tool calls'
names and arguments, ``tool_call_id``; 3 tokens priming the reply). With cl100k_base
this is what LiteLLM's own default counting does too, except that LiteLLM leaves out
the tool calls' function names; the bench reports that difference per shape.

``SharedCounter`` implements trimproxy's ``TokenCounter`` Protocol, so trimproxy's
``trim`` gets it the way the proxy gets its configured counter, and it has plain sync
helpers for the peers. It keeps a per-message count cache keyed by the message's
JSON, like the proxy's counters do: a conversation that resends its history costs
only what is new. ``fresh()`` gives the same tokenizer with an empty cache, which
is what "cold" means in the timings.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from proxy.tokens.approx import estimate_text
from proxy.types import JSONObject, Message, PromptCount

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING = 3

REPO = Path(__file__).resolve().parents[2]
#: Where bench/compare/setup.sh puts the cl100k_base file, under the file name
#: tiktoken's own cache uses for it, so tiktoken finds it without a network.
TIKTOKEN_CACHE = REPO / ".cache" / "tiktoken"

TextTokens = Callable[[str], int]


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return orjson.dumps(content).decode()


class SharedCounter:
    """A ``TokenCounter`` over any text tokenizer, with a per-message cache."""

    exact = False
    additive = True
    max_token_chars = None

    def __init__(self, text_tokens: TextTokens, name: str) -> None:
        self.text_tokens = text_tokens
        self.name = name
        self._cache: dict[bytes, int] = {}

    def fresh(self) -> SharedCounter:
        return SharedCounter(self.text_tokens, self.name)

    def _uncached(self, m: Message) -> int:
        tok = self.text_tokens
        n = TOKENS_PER_MESSAGE + tok(str(m.get("role", ""))) + tok(_text(m.get("content")))
        name = m.get("name")
        if isinstance(name, str):
            n += tok(name) + TOKENS_PER_NAME
        calls = m.get("tool_calls")
        if calls:
            for c in calls:
                fn = c.get("function") or {}
                n += tok(str(fn.get("name", ""))) + tok(str(fn.get("arguments", "")))
        call_id = m.get("tool_call_id")
        if isinstance(call_id, str):
            n += tok(call_id)
        return n

    def message_tokens(self, m: Message) -> int:
        key = orjson.dumps(m)
        n = self._cache.get(key)
        if n is None:
            n = self._cache[key] = self._uncached(m)
        return n

    def per_message(self, messages: Sequence[Message]) -> tuple[int, ...]:
        return tuple(self.message_tokens(m) for m in messages)

    def prompt_tokens(self, messages: Sequence[Message]) -> int:
        return REPLY_PRIMING + sum(self.message_tokens(m) for m in messages)

    def prompt_tokens_uncached(self, messages: Sequence[Message]) -> int:
        """Same count, tokenizing every message again: a counter as people write it."""
        return REPLY_PRIMING + sum(self._uncached(m) for m in messages)

    # The TokenCounter Protocol, for trimproxy's trim.
    async def count(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[JSONObject] | None = None,
        model: str | None = None,
    ) -> PromptCount:
        return PromptCount(self.per_message(messages), REPLY_PRIMING)

    async def count_prompt(
        self, text: str, *, model: str | None = None, special_tokens: bool = True
    ) -> int:
        return self.text_tokens(text)

    async def aclose(self) -> None:
        return None


def approx_counter() -> SharedCounter:
    """trimproxy's approx estimate as the shared tokenizer: needs no files."""
    return SharedCounter(estimate_text, "approx")


def tiktoken_counter(encoding: str = "cl100k_base") -> SharedCounter:
    """tiktoken's ``encoding``, loaded offline from .cache/tiktoken when it is there.

    Raises ``RuntimeError`` with the fix when the BPE file is neither cached nor
    downloadable."""
    if TIKTOKEN_CACHE.is_dir():
        os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(TIKTOKEN_CACHE))
    import tiktoken

    try:
        enc = tiktoken.get_encoding(encoding)
    except Exception as e:  # tiktoken raises whatever its HTTP client raised
        raise RuntimeError(
            f"tiktoken cannot load {encoding}: {e}. Run `bash bench/compare/setup.sh` "
            f"(it seeds {TIKTOKEN_CACHE} from a bundled copy) or pass --counter approx."
        ) from e
    encode = enc.encode_ordinary  # user text may contain special-token strings

    def text_tokens(text: str) -> int:
        return len(encode(text)) if text else 0

    return SharedCounter(text_tokens, f"tiktoken:{encoding}")


def build(kind: str) -> SharedCounter:
    if kind == "approx":
        return approx_counter()
    if kind.startswith("tiktoken"):
        _, _, encoding = kind.partition(":")
        return tiktoken_counter(encoding or "cl100k_base")
    raise ValueError(f"unknown counter {kind!r}: use tiktoken[:<encoding>] or approx")
