"""The approx estimate is an upper bound on real BPE vocabularies, and not a loose one."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiktoken
from tokenizers import Tokenizer

from proxy.tokens.approx import estimate_text
from tests.tokens.published import cl100k_encoding

TEXTS = {
    "english": "The committee reviewed the quarterly figures and asked for a revised "
    "forecast before the board meeting next Tuesday. " * 20,
    # Full-width punctuation on purpose: it is part of what CJK text costs.
    "chinese": "请把这段话翻译成英文，并保留所有的专有名词和数字格式。"  # noqa: RUF001
    "我们明天上午开会讨论预算。" * 20,
    "japanese": "明日の会議では、新しい製品の価格と発売日について話し合います。" * 20,
    "mixed": "部署 the service 到 Kubernetes 集群, then 检查 the logs 和 metrics. " * 20,
    "digits": "Order 4815162342 shipped on 2026-11-30 at 13:37, total 1234567.89 EUR. " * 20,
    "code": "def trim(messages, budget):\n    return [m for m in messages if m['role']]\n" * 20,
    "russian": "Пожалуйста, переведите этот текст на английский язык и сохраните имена. " * 20,
}


@pytest.fixture(scope="module")
def cl100k() -> tiktoken.Encoding:
    return cl100k_encoding()


@pytest.mark.parametrize("kind", sorted(TEXTS))
def test_bound_holds_for_cl100k(kind: str, cl100k: tiktoken.Encoding) -> None:
    text = TEXTS[kind]
    real = len(cl100k.encode_ordinary(text))
    estimate = estimate_text(text)
    assert estimate >= real, (kind, estimate, real)
    assert estimate <= 2.5 * real, (kind, estimate, real)  # a bound that still trims late


@pytest.mark.parametrize("kind", sorted(TEXTS))
def test_bound_holds_for_a_published_chat_tokenizer(kind: str, deepseek_dir: Path) -> None:
    tokenizer = Tokenizer.from_file(str(deepseek_dir / "tokenizer.json"))
    text = TEXTS[kind]
    real = len(tokenizer.encode(text, add_special_tokens=False).ids)
    estimate = estimate_text(text)
    assert estimate >= real, (kind, estimate, real)
    assert estimate <= 2.5 * real, (kind, estimate, real)
