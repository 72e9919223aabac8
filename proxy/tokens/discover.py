"""``TRIMPROXY_TOKENIZER=auto``: find the served model's tokenizer without a hub.

1. Ask the upstream which model it serves (``Upstream.models()``, its ``/v1/models``:
   vLLM reports the model's path or id as ``root``, FastChat only a name as ``id``). If one of those
   is a local directory with tokenizer files, or a model id in the local Hugging
   Face cache, count with it (``hf``): exact and fast.
2. Else, if the upstream answers ``POST /tokenize`` (vLLM), use it (``upstream``).
3. Else the conservative estimate (``approx``), with a warning saying what to set.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from proxy.engines.served import ServedModel
from proxy.upstream import Upstream

log = logging.getLogger("trimproxy.tokens")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps models, read from the environment now (its own
    constant is read once at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def local_tokenizer(name: str) -> Path | None:
    """A directory holding ``name``'s tokenizer files, on local disk only."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path if any((path / f).is_file() for f in TOKENIZER_FILES) else None
    if name.count("/") != 1:
        return None
    repo = hub_cache_dir() / ("models--" + name.replace("/", "--"))
    ref = repo / "refs" / "main"
    snapshots = [repo / "snapshots" / ref.read_text().strip()] if ref.is_file() else []
    if not snapshots and (repo / "snapshots").is_dir():
        snapshots = sorted((repo / "snapshots").iterdir())
    for snapshot in snapshots:
        if (snapshot / "tokenizer_config.json").is_file():
            return snapshot
    return None


async def served_names(upstream: Upstream) -> list[str]:
    """The names the upstream serves its models under and by (``Upstream.models()``):
    each entry's ``root`` (vLLM: the model's path or id) before its ``id``."""
    return candidates(await upstream.models())


def candidates(models: Iterable[ServedModel]) -> list[str]:
    names: list[str] = []
    for entry in models:
        for value in (entry.root, entry.id):
            if value and value not in names:
                names.append(value)
    return names
