"""The published tokenizer files load whole, whatever an earlier run left behind."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.tokens.published import CL100K, cl100k_encoding, fetch


def test_cl100k_loads_past_a_cached_copy_cut_short(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The copy tiktoken keeps of each file it reads, keyed by the file's path: here
    # one cut short, as a run that read the file half-written would have left it.
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    path = fetch(CL100K) / "cl100k_base.tiktoken"
    whole = path.read_bytes()
    cached = tmp_path / hashlib.sha1(str(path).encode()).hexdigest()
    cached.write_bytes(whole[: len(whole) * 6 // 10])

    encoding = cl100k_encoding()

    assert encoding.n_vocab == 100_256
    assert encoding.encode_ordinary("hello world") == [15339, 1917]
    assert cached.read_bytes() == whole
