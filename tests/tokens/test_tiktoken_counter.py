"""tiktoken backend: loads only from TIKTOKEN_CACHE_DIR, never from the network."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import tiktoken
import tiktoken.load
import tiktoken.registry

from proxy.tokens.errors import ConfigError
from proxy.tokens.tiktoken_counter import TiktokenCounter
from tests.tokens.netguard import forbid_network
from tests.tokens.published import CL100K, fetch

URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # tiktoken memoises loads
    return tmp_path


def install(cache_dir: Path) -> Path:
    # tiktoken names cache files by the sha1 of the URL they came from.
    dest = cache_dir / hashlib.sha1(URL.encode()).hexdigest()
    shutil.copy(fetch(CL100K) / "cl100k_base.tiktoken", dest)
    return dest


def test_tiktoken_itself_reaches_for_the_network(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The trap this backend guards against: a missing cache file means a download.
    attempts = forbid_network(monkeypatch)
    with pytest.raises(Exception):  # noqa: B017 - whatever requests makes of it
        tiktoken.load.read_file_cached(URL, SHA256)
    assert attempts


async def test_counts_from_the_cache_dir(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(cache_dir)
    attempts = forbid_network(monkeypatch)
    counter = await TiktokenCounter.load("cl100k_base")
    try:
        got = await counter.count(
            [
                {"role": "user", "content": "hello world"},
                {"role": "assistant", "content": "hi", "name": "bot"},
            ]
        )
        # 3 per message + role + content (+ name and 1 for it), 3 to prime the reply;
        # "hello world" is 2 tokens in cl100k, "user"/"assistant"/"hi"/"bot" one each.
        assert got.per_message == (3 + 1 + 2, 3 + 1 + 1 + 1 + 1)
        assert got.overhead == 3
        tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
        with_tools = await counter.count([{"role": "user", "content": "x"}], tools=tools)
        assert with_tools.overhead > 3
        text = "word " * 10_000
        big = await counter.count([{"role": "user", "content": text}])
        # encoded off the event loop, same count
        assert big.per_message[0] == 3 + 1 + len(counter._enc.encode_ordinary(text))
    finally:
        await counter.aclose()
    assert attempts == []


@pytest.mark.parametrize("corrupt", [False, True])
async def test_missing_or_corrupt_file_fails_at_start_up_without_network(
    corrupt: bool, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if corrupt:
        install(cache_dir).write_bytes(b"not an encoding")
    attempts = forbid_network(monkeypatch)
    with pytest.raises(ConfigError) as err:
        await TiktokenCounter.load("cl100k_base")
    message = str(err.value)
    assert "TIKTOKEN_CACHE_DIR" in message and hashlib.sha1(URL.encode()).hexdigest() in message
    assert "\n" not in message
    assert attempts == []
    assert tiktoken.load.read_file.__name__ == "read_file"  # the swap was undone


async def test_unknown_encoding(cache_dir: Path) -> None:
    with pytest.raises(ConfigError, match="unknown encoding"):
        await TiktokenCounter.load("no_such_base")
