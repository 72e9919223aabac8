"""The ``upstream`` backend (``VllmCounter``) against a vLLM-like /tokenize on 127.0.0.1;
auto detection. Every counter gets the app's ``Upstream``, never an HTTP session."""

from __future__ import annotations

import logging
import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from proxy.settings import Settings
from proxy.tokens import ApproxCounter, ConfigError, build_counter
from proxy.tokens.hf import HFCounter
from proxy.tokens.vllm import VllmCounter
from proxy.upstream import Upstream
from tests.tokens.conversations import TOOLS, growing_chat
from tests.tokens.fake_vllm import FakeVLLM
from tests.tokens.netguard import forbid_network


@pytest.fixture(scope="module")
def qwenlike(template_dir: Callable[[str], Path]) -> Path:
    return template_dir("tools_default_system")


def settings(url: str, tokenizer: str) -> Settings:
    return Settings(upstream_url=url, tokenizer=tokenizer)


@asynccontextmanager
async def upstream_at(url: str) -> AsyncIterator[Upstream]:
    upstream = Upstream(Settings(upstream_url=url))
    try:
        yield upstream
    finally:
        await upstream.aclose()


async def test_exact_total_and_few_round_trips(
    qwenlike: Path, hf_counter: Callable[[Path], HFCounter]
) -> None:
    hf = hf_counter(qwenlike)
    chat = growing_chat(5)
    async with FakeVLLM(hf._tok).running() as server, upstream_at(server.url) as http:
        counter = await build_counter(settings(server.url, "upstream"), http)
        assert isinstance(counter, VllmCounter) and counter.exact
        server.calls.clear()
        first = await counter.count(chat[:-1], model="tiny-chat")
        # one for the total, one per message, three per role to learn its constant
        # (the probes of one role are two lone messages and the pair)
        assert len(server.calls) == 1 + (len(chat) - 1) + 3 * 3
        want = await hf.count(chat[:-1])
        assert first.total == want.total
        # ChatML: a message's lone count less the constant is its own segment
        assert first.per_message == want.per_message

        server.calls.clear()
        assert await counter.count(chat[:-1], model="tiny-chat") == first
        assert server.calls == []  # the same request again: nothing to ask

        grown = [*chat, {"role": "user", "content": "one more"}]
        got = await counter.count(grown, model="tiny-chat")
        assert len(server.calls) == 3  # the total and the two new messages
        assert got.total == (await hf.count(grown)).total

        with_tools = await counter.count(grown, tools=TOOLS, model="tiny-chat")
        assert with_tools.total == (await hf.count(grown, tools=TOOLS)).total
        assert with_tools.per_message == got.per_message  # the schemas are overhead


async def test_a_message_the_template_refuses_alone_is_estimated(
    tiny_dir: Path, hf_counter: Callable[[Path], HFCounter]
) -> None:
    hf = hf_counter(tiny_dir)  # FastChat's template: raises on a "tool" role
    async with FakeVLLM(hf._tok).running() as server, upstream_at(server.url) as http:
        counter = VllmCounter(http, default_model="tiny-chat")
        got = await counter.count([{"role": "user", "content": "x"}])
        assert got.total == (await hf.count([{"role": "user", "content": "x"}])).total
        bad = await counter.count([{"role": "tool", "content": "x"}])  # vLLM: 400
        assert bad == await ApproxCounter().count([{"role": "tool", "content": "x"}])


async def test_no_tokenize_route_is_a_start_up_error(
    qwenlike: Path, hf_counter: Callable[[Path], HFCounter]
) -> None:
    async with (
        FakeVLLM(hf_counter(qwenlike)._tok, tokenize=False).running() as server,
        upstream_at(server.url) as http,
    ):
        with pytest.raises(ConfigError, match="no POST /tokenize"):
            await build_counter(settings(server.url, "upstream"), http)


async def test_unreachable_upstream_counts_by_estimate(caplog: pytest.LogCaptureFixture) -> None:
    async with upstream_at("http://127.0.0.1:9") as http:
        counter = await build_counter(settings("http://127.0.0.1:9", "upstream"), http)
        messages = [{"role": "user", "content": "hello"}]
        assert await counter.count(messages) == await ApproxCounter().count(messages)


async def test_auto_prefers_the_served_models_local_tokenizer(
    qwenlike: Path, hf_counter: Callable[[Path], HFCounter]
) -> None:
    server = FakeVLLM(hf_counter(qwenlike)._tok, root=str(qwenlike))
    async with server.running(), upstream_at(server.url) as http:
        counter = await build_counter(settings(server.url, "auto"), http)
        assert isinstance(counter, HFCounter)
        await counter.aclose()


async def test_auto_falls_back_to_tokenize_then_to_approx(
    qwenlike: Path, hf_counter: Callable[[Path], HFCounter], caplog: pytest.LogCaptureFixture
) -> None:
    tok = hf_counter(qwenlike)._tok
    async with (
        FakeVLLM(tok, root="nowhere/on-disk").running() as server,
        upstream_at(server.url) as http,
    ):
        assert isinstance(await build_counter(settings(server.url, "auto"), http), VllmCounter)
    async with FakeVLLM(tok, tokenize=False).running() as server, upstream_at(server.url) as http:
        with caplog.at_level(logging.WARNING, logger="trimproxy.tokens"):
            counter = await build_counter(settings(server.url, "auto"), http)
        assert isinstance(counter, ApproxCounter)
        assert "TRIMPROXY_TOKENIZER=hf:" in caplog.text


async def test_model_id_resolves_in_the_local_hf_cache_without_network(
    qwenlike: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = tmp_path / "models--acme--tiny-chat" / "snapshots" / "abc123"
    shutil.copytree(qwenlike, snapshot)
    (tmp_path / "models--acme--tiny-chat" / "refs").mkdir()
    (tmp_path / "models--acme--tiny-chat" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    attempts = forbid_network(monkeypatch)
    async with upstream_at("http://127.0.0.1:9") as http:
        counter = await build_counter(settings("http://127.0.0.1:9", "hf:acme/tiny-chat"), http)
        assert isinstance(counter, HFCounter)
        assert (await counter.count([{"role": "user", "content": "hi"}])).total > 0
        await counter.aclose()
        with pytest.raises(ConfigError, match="not in the local Hugging Face cache"):
            await build_counter(settings("http://127.0.0.1:9", "hf:acme/other"), http)
    assert attempts == []


@pytest.mark.parametrize("spec", ["/no/such/dir", "{empty}"])
async def test_hf_start_up_errors_are_one_line(spec: str, tmp_path: Path) -> None:
    spec = spec.replace("{empty}", str(tmp_path))
    async with upstream_at("http://127.0.0.1:9") as http:
        with pytest.raises(ConfigError) as err:
            await build_counter(settings("http://127.0.0.1:9", f"hf:{spec}"), http)
    assert "\n" not in str(err.value) and "TRIMPROXY_TOKENIZER=hf:" in str(err.value)


async def test_a_tokenizer_without_chat_template_is_refused(tiny_dir: Path, tmp_path: Path) -> None:
    import json

    shutil.copytree(tiny_dir, tmp_path / "t")
    config = json.loads((tmp_path / "t" / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (tmp_path / "t" / "tokenizer_config.json").write_text(json.dumps(config))
    async with upstream_at("http://127.0.0.1:9") as http:
        with pytest.raises(ConfigError, match="no chat template"):
            await build_counter(settings("http://127.0.0.1:9", f"hf:{tmp_path / 't'}"), http)
