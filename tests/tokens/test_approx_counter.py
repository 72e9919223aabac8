"""ApproxCounter.count, with its cached and inlined paths, gives every message what
estimate_message gives it, and its text cache stays a bounded LRU."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.tokens.approx import (
    MESSAGE_OVERHEAD,
    REPLY_PRIMING,
    ApproxCounter,
    estimate_message,
    estimate_text,
)
from proxy.tokens.cache import ByteLRU
from proxy.types import Message

LONG = "The committee reviewed the quarterly figures and asked for a forecast. " * 6
DIGITS = "Order 4815162342 shipped on 2026-11-30 at 13:37, total 1234567.89 EUR. " * 6
CJK = "请把这段话翻译成英文，并保留所有的专有名词和数字格式。" * 12  # noqa: RUF001
MIXED = "部署 the service 到 Kubernetes 集群, then 检查 the logs. " * 8
CYRILLIC = "Пожалуйста, переведите этот текст на английский язык. " * 6


class Text(str):
    """A str subclass: not what JSON gives, so it takes the long way."""


MESSAGES: list[Message] = [
    {"role": "system", "content": LONG},
    {"role": "user", "content": DIGITS},
    {"role": "assistant", "content": CJK},
    {"role": "user", "content": MIXED},
    {"role": "user", "content": CYRILLIC},
    {"role": "user", "content": "short, 12 digits 123456789012"},
    {"role": "user", "content": "短い日本語"},
    {"role": "user", "content": ""},
    {"role": "user", "content": "x" * 255},
    {"role": "user", "content": "7" * 256},
    {"role": "assistant", "content": None},
    {"role": "assistant"},
    {"role": "user", "content": [{"type": "text", "text": LONG}, {"type": "image_url"}]},
    {"role": "user", "content": {"odd": "shape"}},
    {"role": "user", "content": LONG, "name": "alice"},
    {"role": "user", "content": "hi", "name": "bob"},
    {"content": LONG, "name": "carol"},  # two keys, but no role: its name is counted
    {
        "role": "assistant",
        "content": LONG,
        "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": '{"a": 1}'}}],
    },
    {"role": "tool", "content": DIGITS, "tool_call_id": "c1"},
    {"role": "assistant", "content": CJK, "reasoning_content": "思考 " * 100},
    {"role": "user", "content": Text(LONG)},
    {"role": "user", "content": Text("short")},
]


def fresh(messages: list[Message]) -> list[Message]:
    """Equal messages with new string objects, as a new request's parse gives."""

    def copy(value: Any) -> Any:
        if type(value) is str:
            return "".join(list(value))
        if isinstance(value, dict):
            return {copy(k): copy(v) for k, v in value.items()}
        if isinstance(value, list):
            return [copy(v) for v in value]
        return value

    return [copy(m) for m in messages]


async def test_every_message_gets_what_estimate_message_gives() -> None:
    counter = ApproxCounter()
    want = tuple(estimate_message(m) for m in MESSAGES)
    for _ in range(3):  # misses, then hits on new string objects
        count = await counter.count(fresh(MESSAGES), model="m")
        assert count.per_message == want
        assert count.overhead == REPLY_PRIMING
    for i, message in enumerate(MESSAGES):  # alone, in any order
        count = await counter.count([message])
        assert count.per_message == (want[i],), message


async def test_tools_are_overhead_and_messages_unchanged() -> None:
    counter = ApproxCounter()
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    with_tools = await counter.count(MESSAGES, tools=tools)
    without = await counter.count(MESSAGES)
    assert with_tools.per_message == without.per_message
    assert with_tools.overhead > without.overhead == REPLY_PRIMING
    # The same tools again (an agent sends them every turn): read from the cache.
    hits = counter._texts.hits
    again = await counter.count([], tools=orjson.loads(orjson.dumps(tools)))
    assert (again.overhead, counter._texts.hits) == (with_tools.overhead, hits + 1)


async def test_plain_texts_are_cached_and_counted() -> None:
    counter = ApproxCounter()
    texts = counter._texts
    plain = [{"role": "user", "content": t} for t in (LONG, DIGITS, CJK)]
    await counter.count(fresh(plain))
    assert (texts.hits, texts.misses, len(texts)) == (0, 3, 3)
    await counter.count(fresh(plain))
    assert (texts.hits, texts.misses, len(texts)) == (3, 3, 3)


async def test_every_text_of_every_message_is_cached() -> None:
    """Short texts, tool outputs, calls' JSON, ids, names, parts: each text the estimate
    reads is kept, so a resent history is estimated once."""
    counter = ApproxCounter()
    texts = counter._texts
    read: list[str] = []

    def record(text: str) -> int:
        read.append(text)
        return estimate_text(text)

    for message in MESSAGES:
        estimate_message(message, record)
    first = await counter.count(fresh(MESSAGES))
    assert set(texts._data) == set(read)
    assert (texts.hits + texts.misses, len(texts)) == (len(read), len(set(read)))
    misses = texts.misses
    again = await counter.count(fresh(MESSAGES))
    assert again == first
    assert (texts.misses, texts.hits) == (misses, len(read) - misses + len(read))


async def test_the_text_cache_stays_within_its_bytes() -> None:
    budget = 4 * ByteLRU.weigh(LONG + "0000")
    counter = ApproxCounter(cache_bytes=budget)
    for i in range(50):
        message: Message = {"role": "user", "content": f"{i:04d}" + LONG}
        count = await counter.count([message])
        assert count.per_message == (estimate_message(message),)
        assert counter._texts.bytes <= budget
    assert len(counter._texts) == 4


async def test_the_cache_keeps_what_each_request_touched() -> None:
    budget = 3 * ByteLRU.weigh(LONG + "00")
    counter = ApproxCounter(cache_bytes=budget)
    a, b, c, d = ({"role": "user", "content": f"{k}:" + LONG} for k in "abcd")
    await counter.count([a, b, c])
    await counter.count(fresh([a]))  # a becomes the newest
    await counter.count([d])  # b, the oldest, goes
    texts = counter._texts
    assert texts.get(a["content"]) is not None and texts.get(b["content"]) is None


def test_get_makes_a_hit_the_newest_and_counts_hits_and_misses() -> None:
    cache: ByteLRU[str, int] = ByteLRU(max_bytes=3 * ByteLRU.weigh("k0"))
    for i in range(3):
        cache.put(f"k{i}", i)
    assert cache.get("k0") == 0 and cache.get("zz") is None
    assert (cache.hits, cache.misses) == (1, 1)
    cache.put("k3", 3)  # k0 was touched, so k1 is now the oldest and goes
    assert cache.get("k1") is None and cache.get("k0") == 0
    assert (cache.hits, cache.misses) == (2, 2)


def test_put_many_is_put_of_each_pair_counted_as_misses() -> None:
    weight = ByteLRU.weigh("k0")
    many: ByteLRU[str, int] = ByteLRU(max_bytes=3 * weight)
    one: ByteLRU[str, int] = ByteLRU(max_bytes=3 * weight)
    one.put("k0", 0)
    many.put("k0", 0)
    pairs = [("k1", 1), ("k2", 2), ("k1", 10), ("k3", 3), ("x" * 10_000, 4)]
    for key, value in pairs:
        one.put(key, value)
    many.put_many(pairs)  # k1 again: replaced, weighed once; the huge key: not kept
    assert (
        list(many._data.items())
        == list(one._data.items())
        == [
            ("k2", 2),
            ("k1", 10),
            ("k3", 3),
        ]
    )
    assert many.bytes == one.bytes == 3 * weight
    assert (many.hits, many.misses) == (0, len(pairs))


def test_lookups_are_get_taken_apart() -> None:
    cache: ByteLRU[str, int] = ByteLRU(max_bytes=3 * ByteLRU.weigh("k0"))
    for i in range(3):
        cache.put(f"k{i}", i)
    lookup, touch = cache.lookups()
    assert lookup("k0") == 0 and lookup("zz") is None
    touch("k0")  # now the newest: k1 goes first
    cache.put("k3", 3)
    assert lookup("k1") is None and lookup("k0") == 0
    with pytest.raises(KeyError):
        touch("zz")
    assert (cache.hits, cache.misses) == (0, 0)  # lookups count nothing themselves


def test_the_framing_is_counted_once_per_message() -> None:
    # The cached path adds MESSAGE_OVERHEAD to the text's estimate, as estimate_message does.
    assert estimate_message({"role": "user", "content": ""}) == MESSAGE_OVERHEAD
