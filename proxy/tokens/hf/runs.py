"""Exact token counts of rendered prompts, at the cost of what is new in them.

A rendered prompt is cut at its added tokens (``splitter``); each run of text in
between is counted once and cached by its text, so a request that repeats the
whole history pays only for the runs it has not sent before. Uncached runs go to
the tokenizer in one ``encode_batch`` call, which releases the GIL: a big new
message is encoded in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor

from proxy.tokens.cache import ByteLRU
from proxy.tokens.hf.added_tokens import AddedTokenSplitter

#: Counts of each text in a batch, in order.
EncodeBatch = Callable[[list[str]], list[int]]

#: Below this many uncached characters, encoding inline is cheaper than a thread hop.
INLINE_CHARS = 4096


class RunCounter:
    """``spans(text)`` → ``[(start offset, tokens), ...]`` for each piece of the text.

    ``anchor`` is an added token put in front of every run that does not start the
    text: in the real prompt such a run always follows an added token, and some
    pre-tokenizers (Metaspace with ``prepend_scheme="first"``) treat the start of the
    input differently. The anchor's one token is subtracted again.
    """

    def __init__(
        self,
        splitter: AddedTokenSplitter,
        encode: EncodeBatch,
        *,
        anchor: str | None,
        cache_bytes: int,
        executor: Executor | None,
        inline_chars: int = INLINE_CHARS,
    ) -> None:
        self.splitter = splitter
        self._encode = encode
        self._anchor = anchor
        self.cache: ByteLRU[str, int] = ByteLRU(cache_bytes)
        # The first run of a prompt is counted without the anchor, so it has its own map.
        self._first: ByteLRU[str, int] = ByteLRU(max(cache_bytes // 16, 1 << 20))
        self._executor = executor
        self._inline_chars = inline_chars

    def clear(self) -> None:
        self.cache.clear()
        self._first.clear()

    def _plan(self, text: str) -> tuple[list[tuple[int, int]], list[tuple[int, str, bool]]]:
        """Known pieces as (start, tokens); unknown runs as (slot, text, first)."""
        pieces: list[tuple[int, int]] = []
        missing: list[tuple[int, str, bool]] = []
        # Once per request over every run of the prompt (~40 for 20 messages): the
        # lookups are the maps' own C calls, bound once (ByteLRU.lookups).
        cache, first_cache = self.cache, self._first
        get, touch = cache.lookups()
        hits = 0
        pos = 0
        token = False  # the parts alternate: a run, an added token, a run, ...
        for part in self.splitter.split(text):
            if token:
                pieces.append((pos, 1))  # an added token
            elif part:
                if pos == 0:  # the first run is counted without the anchor: its own map
                    known = first_cache.get(part)
                else:
                    known = get(part)
                    if known is None:
                        cache.misses += 1
                    else:
                        touch(part)
                        hits += 1
                if known is None:
                    missing.append((len(pieces), part, pos == 0))
                    known = -1
                pieces.append((pos, known))
            pos += len(part)
            token = not token
        cache.hits += hits
        return pieces, missing

    def _encode_runs(self, runs: list[tuple[str, bool]]) -> list[int]:
        anchor = self._anchor
        if anchor is None:
            return self._encode([chunk for chunk, _ in runs])
        batch = [chunk if first else anchor + chunk for chunk, first in runs]
        counts = self._encode(batch)
        return [n if first else n - 1 for n, (_, first) in zip(counts, runs, strict=True)]

    def _fill(
        self,
        pieces: list[tuple[int, int]],
        missing: list[tuple[int, str, bool]],
        counts: list[int],
        order: dict[tuple[str, bool], int],
    ) -> list[tuple[int, int]]:
        for slot, chunk, first in missing:
            n = counts[order[(chunk, first)]]
            pieces[slot] = (pieces[slot][0], n)
            (self._first if first else self.cache).put(chunk, n)
        return pieces

    @staticmethod
    def _unique(missing: list[tuple[int, str, bool]]) -> dict[tuple[str, bool], int]:
        order: dict[tuple[str, bool], int] = {}
        for _, chunk, first in missing:
            order.setdefault((chunk, first), len(order))
        return order

    def spans_sync(self, text: str) -> list[tuple[int, int]]:
        pieces, missing = self._plan(text)
        if not missing:
            return pieces
        order = self._unique(missing)
        return self._fill(pieces, missing, self._encode_runs(list(order)), order)

    async def spans(self, text: str) -> list[tuple[int, int]]:
        pieces, missing = self._plan(text)
        if not missing:
            return pieces
        order = self._unique(missing)
        runs = list(order)
        if sum(len(chunk) for chunk, _ in runs) <= self._inline_chars or self._executor is None:
            counts = self._encode_runs(runs)
        else:
            loop = asyncio.get_running_loop()
            counts = await loop.run_in_executor(self._executor, self._encode_runs, runs)
        # Another request may have filled the caches meanwhile; the counts are the same.
        return self._fill(pieces, missing, counts, order)
