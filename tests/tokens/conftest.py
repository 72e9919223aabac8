"""Fixtures for the token-counter tests: tokenizers on disk, loaded counters."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.tokens.hf import HFCounter, load_tokenizer
from tests.support.tiny_model import build_tokenizer
from tests.tokens.published import DEEPSEEK_R1, fetch
from tests.tokens.templates import FAILING, TEMPLATES


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def template_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The tiny tokenizer with one of tests/tokens/templates.py as its chat template
    (``TEMPLATES`` or ``FAILING``)."""
    made: dict[str, Path] = {}

    def make(name: str) -> Path:
        if name not in made:
            dest = tmp_path_factory.mktemp(name)
            shutil.copytree(tiny_dir, dest, dirs_exist_ok=True)
            config = json.loads((dest / "tokenizer_config.json").read_text())
            config["chat_template"] = {**TEMPLATES, **FAILING}[name]
            (dest / "tokenizer_config.json").write_text(json.dumps(config))
            made[name] = dest
        return made[name]

    return make


@pytest.fixture(scope="session")
def deepseek_dir() -> Path:
    return fetch(DEEPSEEK_R1)


@pytest.fixture(scope="session")
def hf_counter() -> Callable[[Path], HFCounter]:
    """A loaded, self-checked HFCounter per tokenizer directory (loading costs ~0.5 s)."""
    loaded: dict[Path, HFCounter] = {}

    def get(path: Path) -> HFCounter:
        if path not in loaded:
            counter = HFCounter(load_tokenizer(str(path)), str(path))
            counter.self_check()
            loaded[path] = counter
        return loaded[path]

    return get
