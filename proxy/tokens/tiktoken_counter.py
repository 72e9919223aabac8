"""The ``tiktoken:<encoding>`` backend: tiktoken plus the chat format's framing.

Close, not exact: OpenAI's chat format costs 3 tokens a message (plus 1 for a
``name``) and 3 to prime the reply; tool calls and tool schemas are counted as
their JSON, which is near what the model sees but not what it sees.

Encoding files come from ``TIKTOKEN_CACHE_DIR`` only. tiktoken itself downloads a
missing file, and deletes and re-downloads a corrupt one; here the download
function is swapped out while the encoding loads, so a missing or bad file is a
start-up error that says which file to put where, never a network call.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import orjson

from proxy.tokens.approx import IMAGE_TOKENS
from proxy.tokens.cache import ByteLRU
from proxy.tokens.errors import ConfigError
from proxy.types import JSONObject, Message, PromptCount

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING = 3
#: Messages longer than this are encoded in a worker thread, off the event loop.
INLINE_CHARS = 8192

# tiktoken's module-level loader is process-wide; loads are serialised around the swap.
_LOAD_LOCK = threading.Lock()


class _Offline(Exception):
    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.url = url


@contextmanager
def _no_downloads() -> Iterator[None]:
    import tiktoken.load as tl

    def refuse(blobpath: str) -> bytes:
        if "://" in blobpath:
            raise _Offline(blobpath)
        with open(blobpath, "rb") as f:
            return f.read()

    with _LOAD_LOCK:
        original: Callable[[str], bytes] = tl.read_file
        setattr(tl, "read_file", refuse)  # noqa: B010 (typed module attribute)
        try:
            yield
        finally:
            setattr(tl, "read_file", original)  # noqa: B010


def load_encoding(name: str) -> Any:
    import tiktoken

    if name not in tiktoken.list_encoding_names():
        raise ConfigError(
            f"TRIMPROXY_TOKENIZER=tiktoken:{name}: unknown encoding; known: "
            + ", ".join(sorted(tiktoken.list_encoding_names()))
        )
    cache_dir = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    try:
        with _no_downloads():
            return tiktoken.get_encoding(name)
    except _Offline as missing:
        key = hashlib.sha1(missing.url.encode()).hexdigest()
        where = f"TIKTOKEN_CACHE_DIR ({cache_dir})" if cache_dir else "TIKTOKEN_CACHE_DIR (unset)"
        raise ConfigError(
            f"TRIMPROXY_TOKENIZER=tiktoken:{name}: the encoding file is missing or corrupt in "
            f"{where}; trimproxy never downloads it: copy {missing.url.rsplit('/', 1)[-1]} "
            f"into that directory under the name {key} and set TIKTOKEN_CACHE_DIR"
        ) from None


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(
            p["text"] for p in value if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return "" if value is None else orjson.dumps(value).decode()


def _media(value: Any) -> int:
    if not isinstance(value, list):
        return 0
    return sum(1 for p in value if isinstance(p, dict) and "text" not in p)


class TiktokenCounter:
    name = "tiktoken"
    exact = False
    additive = True

    def __init__(self, encoding: Any, *, cache_bytes: int = 16 * 1024 * 1024) -> None:
        self._enc = encoding
        #: The longest token, in bytes (so at least as long in characters): the cheap
        #: floor on a prompt's count (``proxy.pipeline.prepare``) divides by it.
        self.max_token_chars = (
            max(
                (len(b) for b in (*encoding.token_byte_values(), *encoding.special_tokens_set)),
                default=0,
            )
            or None
        )
        self._cache: ByteLRU[str, int] = ByteLRU(cache_bytes)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trimproxy-tt")

    @classmethod
    async def load(cls, name: str) -> TiktokenCounter:
        return cls(await asyncio.to_thread(load_encoding, name))

    def _count_texts(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self._enc.encode_ordinary_batch(texts)]

    async def _counts(self, texts: list[str]) -> list[int]:
        out = [self._cache.get(t) for t in texts]
        todo = sorted({t for t, n in zip(texts, out, strict=True) if n is None})
        if todo:
            if sum(map(len, todo)) <= INLINE_CHARS:
                counts = [len(self._enc.encode_ordinary(t)) for t in todo]
            else:
                loop = asyncio.get_running_loop()
                counts = await loop.run_in_executor(self._executor, self._count_texts, todo)
            known = dict(zip(todo, counts, strict=True))
            for t, n in known.items():
                self._cache.put(t, n)
            out = [known[t] if n is None else n for t, n in zip(texts, out, strict=True)]
        return [n or 0 for n in out]

    async def count(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[JSONObject] | None = None,
        model: str | None = None,
    ) -> PromptCount:
        texts: list[str] = []
        spans: list[int] = []
        fixed: list[int] = []
        for m in messages:
            parts = [str(m.get("role", "")), _text(m.get("content"))]
            extra = TOKENS_PER_MESSAGE + _media(m.get("content")) * IMAGE_TOKENS
            if isinstance(m.get("name"), str):
                parts.append(m["name"])
                extra += TOKENS_PER_NAME
            for key in ("tool_calls", "tool_call_id"):
                if m.get(key):
                    parts.append(_text(m[key]))
            texts.extend(parts)
            spans.append(len(parts))
            fixed.append(extra)
        if tools:
            texts.append(orjson.dumps(list(tools)).decode())
        counts = await self._counts(texts)
        per: list[int] = []
        pos = 0
        for width, extra in zip(spans, fixed, strict=True):
            per.append(extra + sum(counts[pos : pos + width]))
            pos += width
        overhead = REPLY_PRIMING + (counts[pos] if tools else 0)
        return PromptCount(tuple(per), overhead)

    async def count_prompt(
        self, text: str, *, model: str | None = None, special_tokens: bool = True
    ) -> int:
        """The text's tokens: OpenAI's encodings add no BOS, so ``special_tokens``
        changes nothing."""
        return (await self._counts([text]))[0]

    async def aclose(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
