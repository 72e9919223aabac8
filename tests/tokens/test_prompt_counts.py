"""Raw prompts (``/v1/completions``) on every counter: ``count_prompt`` encodes the
text as vLLM encodes a completion prompt, special tokens (BOS) added unless told not."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import tiktoken.registry
from tokenizers import Tokenizer, processors

from proxy.settings import Settings
from proxy.tokens import ApproxCounter, build_counter
from proxy.tokens.hf import HFCounter
from proxy.tokens.tiktoken_counter import TiktokenCounter
from proxy.tokens.vllm import VllmCounter
from proxy.upstream import Upstream
from tests.tokens.fake_vllm import FakeVLLM
from tests.tokens.published import CL100K, fetch

TEXTS = [
    "Once upon a time",
    "def add(a, b):\n    return a + b\n",
    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich. 12345",
    "",
]


@pytest.fixture(scope="module")
def bos_dir(deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DeepSeek's tokenizer with a post-processor that adds its BOS to every encoded
    text, as Llama's and many others do."""
    dest = tmp_path_factory.mktemp("bos")
    shutil.copytree(deepseek_dir, dest, dirs_exist_ok=True)
    tokenizer = Tokenizer.from_file(str(dest / "tokenizer.json"))
    bos = json.loads((dest / "tokenizer_config.json").read_text("utf-8"))["bos_token"]["content"]
    adds_bos = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, tokenizer.token_to_id(bos))]
    )
    tokenizer.post_processor = processors.Sequence([tokenizer.post_processor, adds_bos])
    tokenizer.save(str(dest / "tokenizer.json"))
    return dest


@pytest.mark.parametrize("text", TEXTS)
async def test_hf_adds_the_tokenizers_bos_as_vllm_does(
    text: str, bos_dir: Path, hf_counter: Callable[[Path], HFCounter]
) -> None:
    counter = hf_counter(bos_dir)
    plain = Tokenizer.from_file(str(bos_dir / "tokenizer.json"))
    bare = len(plain.encode(text, add_special_tokens=False).ids)
    assert await counter.count_prompt(text, special_tokens=False) == bare
    assert await counter.count_prompt(text) == bare + 1
    assert await counter.count_prompt(text) == bare + 1  # from the cache, the same


async def test_hf_without_a_bos_adds_nothing(
    tiny_dir: Path, hf_counter: Callable[[Path], HFCounter]
) -> None:
    counter = hf_counter(tiny_dir)
    for text in TEXTS:
        assert await counter.count_prompt(text) == await counter.count_prompt(
            text, special_tokens=False
        )


@pytest.mark.parametrize("text", TEXTS)
async def test_approx_is_a_bound_on_a_real_tokenizer(
    text: str, deepseek_dir: Path, hf_counter: Callable[[Path], HFCounter]
) -> None:
    exact = await hf_counter(deepseek_dir).count_prompt(text)
    assert await ApproxCounter().count_prompt(text) >= exact


async def test_tiktoken_counts_the_text_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
    shutil.copy(
        fetch(CL100K) / "cl100k_base.tiktoken", tmp_path / hashlib.sha1(url.encode()).hexdigest()
    )
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    counter = await TiktokenCounter.load("cl100k_base")
    try:
        encoding = tiktoken.get_encoding("cl100k_base")
        for text in TEXTS:
            assert await counter.count_prompt(text) == len(encoding.encode_ordinary(text))
    finally:
        await counter.aclose()


async def test_upstream_asks_tokenize_with_the_prompt_once(
    bos_dir: Path, hf_counter: Callable[[Path], HFCounter]
) -> None:
    hf = hf_counter(bos_dir)
    async with FakeVLLM(hf._tok).running() as server:
        http = Upstream(Settings(upstream_url=server.url))
        try:
            counter = VllmCounter(http, default_model="tiny-chat")
            for text in TEXTS:
                for special in (True, False):
                    want = await hf.count_prompt(text, special_tokens=special)
                    got = await counter.count_prompt(text, special_tokens=special)
                    assert got == want, (text, special)
            asked = [c for c in server.calls if "prompt" in c]
            assert len(asked) == 2 * len(TEXTS)
            assert asked[0] == {
                "prompt": TEXTS[0], "add_special_tokens": True, "model": "tiny-chat"
            }  # fmt: skip
            await counter.count_prompt(TEXTS[0])
            assert len([c for c in server.calls if "prompt" in c]) == len(asked)  # cached
        finally:
            await http.aclose()


async def test_upstream_failing_counts_by_estimate() -> None:
    settings = Settings(upstream_url="http://127.0.0.1:9")
    http = Upstream(settings)
    try:
        text = TEXTS[1]
        estimate = await ApproxCounter().count_prompt(text)
        assert estimate > await ApproxCounter().count_prompt(text, special_tokens=False)
        auto = await build_counter(settings, http)  # nobody answers: approx for now
        assert auto.name == "approx" and await auto.count_prompt(text) == estimate
        await auto.aclose()
        assert await VllmCounter(http).count_prompt(text) == estimate
    finally:
        await http.aclose()
