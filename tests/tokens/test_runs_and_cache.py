"""Counting by added-token runs agrees with the tokenizer; caches stay in budget;
big encodes leave the event loop free."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, trainers

from proxy.tokens.cache import ByteLRU
from proxy.tokens.hf.added_tokens import AddedTokenSplitter
from proxy.tokens.hf.counter import _added_tokens, _anchor
from proxy.tokens.hf.runs import RunCounter

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, hello tokens",
    "数字 123 and 4567 numbers",
    "  spaced   out  text\n\nnew lines",
] * 50
TEXTS = [
    "<s>hello world</s>",
    "hello <mask> world",  # lstrip+rstrip token eats the spaces around it
    "a<mask>b  <mask>  c",
    "x <word> y",  # single_word: matched here
    "x<word>y",  # ... not here
    "  leading spaces<s>  after<s>",
    "数字<s>123<s> the quick brown fox",
    "",
]


def tokenizer(pre: Any, normalizer: Any = None) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
        ),
    )
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, normalized=False)])
    tok.add_tokens([AddedToken("<word>", single_word=True, normalized=False)])
    return tok


def run_counter(tok: Tokenizer, executor: Any = None, **kw: Any) -> RunCounter:
    def encode(texts: list[str]) -> list[int]:
        return [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)]

    return RunCounter(
        AddedTokenSplitter(_added_tokens(tok)),
        encode,
        anchor=_anchor(tok),
        cache_bytes=1 << 20,
        executor=executor,
        **kw,
    )


@pytest.mark.parametrize("kind", ["bytelevel", "metaspace_first", "whitespace"])
def test_runs_sum_to_the_tokenizers_count(kind: str) -> None:
    pre = {
        "bytelevel": pre_tokenizers.ByteLevel(add_prefix_space=False),
        # Adds "▁" only at the very start of the input: runs that follow an added
        # token must not get it (the anchor trick).
        "metaspace_first": pre_tokenizers.Metaspace(prepend_scheme="first"),
        "whitespace": pre_tokenizers.Whitespace(),
    }[kind]
    tok = tokenizer(pre, normalizers.NFC())
    counter = run_counter(tok)
    for text in TEXTS:
        want = len(tok.encode(text, add_special_tokens=False).ids)
        assert sum(n for _, n in counter.spans_sync(text)) == want, text
        assert sum(n for _, n in counter.spans_sync(text)) == want, text  # cached


def test_splitter_prefers_the_longest_token() -> None:
    splitter = AddedTokenSplitter([_tok("<a>"), _tok("<a><b>"), _tok("<ab>")])
    text = "x<a><b>y<a>z<ab>"
    assert [text[s:e] for s, e in splitter.spans(text)] == ["<a><b>", "<a>", "<ab>"]


def test_split_alternates_runs_and_the_tokens_spans_finds() -> None:
    """``split`` is what the counter walks: runs at even places, the matches of
    ``spans`` (the same ones, stripped whitespace included) at odd ones."""
    from proxy.tokens.hf.added_tokens import AddedToken as Spec

    splitter = AddedTokenSplitter([Spec("<a>"), Spec("<a><b>"), Spec("<e>", lstrip=True)])
    text = "<a><b>y<a><a>z  <e>"
    parts = splitter.split(text)
    assert parts == ["", "<a><b>", "y", "<a>", "", "<a>", "z", "  <e>", ""]
    assert parts[1::2] == [text[s:e] for s, e in splitter.spans(text)]
    assert "".join(parts) == text
    assert AddedTokenSplitter([]).split(text) == [text]


def _tok(content: str) -> Any:
    from proxy.tokens.hf.added_tokens import AddedToken as Spec

    return Spec(content)


def test_byte_lru_is_bounded_by_bytes() -> None:
    cache: ByteLRU[str, int] = ByteLRU(max_bytes=20_000)
    for i in range(1000):
        cache.put(f"{i:04d}" + "x" * 500, i)
        assert cache.bytes <= 20_000
    assert 0 < len(cache) < 1000
    assert cache.get("0999" + "x" * 500) == 999  # the newest survive
    assert cache.get("0000" + "x" * 500) is None  # the oldest went first
    cache.put("y" * 100_000, 1)  # bigger than the budget: not kept
    assert cache.get("y" * 100_000) is None and cache.bytes <= 20_000


def test_recently_used_entries_survive_eviction() -> None:
    cache: ByteLRU[str, int] = ByteLRU(max_bytes=4 * ByteLRU.weigh("k00"))
    for i in range(4):
        cache.put(f"k{i:02d}", i)
    assert cache.get("k00") == 0  # touched: now the newest
    cache.put("k04", 4)
    assert cache.get("k00") == 0 and cache.get("k01") is None


async def test_a_big_uncached_encode_does_not_block_the_event_loop() -> None:
    threads: list[str] = []
    released = threading.Event()

    def slow_encode(texts: list[str]) -> list[int]:
        threads.append(threading.current_thread().name)
        # What a 60k-token encode costs, made an event: it ends only when the event
        # loop, running meanwhile, says so. Encoded on the loop's own thread, it would
        # wait out the guard and fail (no stopwatch on the loop's gaps).
        assert released.wait(10.0), "the event loop was blocked while encoding"
        return [len(t) for t in texts]

    async def release_from_the_loop() -> None:
        while not threads:
            await asyncio.sleep(0.001)
        released.set()

    with ThreadPoolExecutor(1, thread_name_prefix="enc") as pool:
        counter = RunCounter(
            AddedTokenSplitter([]), slow_encode, anchor=None, cache_bytes=1 << 24, executor=pool
        )
        releaser = asyncio.create_task(release_from_the_loop())
        pieces = await counter.spans("word " * 20_000)
        await releaser
    assert pieces == [(0, 100_000)]
    assert threads and threads[0].startswith("enc")


async def test_small_uncached_runs_are_encoded_inline() -> None:
    seen: list[str] = []

    def encode(texts: list[str]) -> list[int]:
        seen.append(threading.current_thread().name)
        return [len(t) for t in texts]

    with ThreadPoolExecutor(1, thread_name_prefix="enc") as pool:
        counter = RunCounter(
            AddedTokenSplitter([]), encode, anchor=None, cache_bytes=1 << 20, executor=pool
        )
        assert await counter.spans("short") == [(0, 5)]
    assert seen == [threading.current_thread().name]
