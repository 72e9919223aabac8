"""Loading the ``hf:<dir or model id>`` backend's tokenizer, from the local disk only:
a directory, or a model id resolved in the local Hugging Face cache (as vLLM
resolves it with ``HF_HUB_OFFLINE=1``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.tokens.discover import hub_cache_dir, local_tokenizer
from proxy.tokens.errors import ConfigError

#: A directory with none of these holds no tokenizer AutoTokenizer could load.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def tokenizer_dir(spec: str) -> Path:
    """The local directory ``hf:<spec>`` names, checked without loading anything, so
    that ``trimproxy serve`` can refuse a bad setting with one line before it starts;
    raises ``ConfigError``."""
    path = Path(spec).expanduser()
    looks_like_path = spec.startswith(("/", ".", "~")) or path.exists()
    if looks_like_path and not path.is_dir():
        raise ConfigError(
            f"TRIMPROXY_TOKENIZER=hf:{spec}: no such directory; point it at the folder "
            "that holds the served model's tokenizer.json and tokenizer_config.json"
        )
    if not looks_like_path:
        # A model id: its snapshot in the local Hugging Face cache, as vLLM finds it
        # with HF_HUB_OFFLINE=1. Resolved here so that the cache location is read from
        # the environment now, and no code path can reach for the network.
        found = local_tokenizer(spec)
        if found is None:
            raise ConfigError(
                f"TRIMPROXY_TOKENIZER=hf:{spec}: not in the local Hugging Face cache "
                f"({hub_cache_dir()}); trimproxy never downloads: fetch the model's tokenizer "
                "files on a machine with access, then set hf:<directory> or HF_HOME"
            )
        path = found
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise ConfigError(
            f"TRIMPROXY_TOKENIZER=hf:{spec}: {path} holds no tokenizer files; point it at "
            "the folder with the served model's tokenizer.json and tokenizer_config.json"
        )
    return path


def load_tokenizer(spec: str) -> Any:
    """The tokenizer named by ``hf:<spec>``, from local files only."""
    from transformers import AutoTokenizer  # slow import: only when this backend is used

    path = tokenizer_dir(spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=False
        )
    except Exception as exc:
        raise ConfigError(
            f"TRIMPROXY_TOKENIZER=hf:{spec}: cannot load a tokenizer from {path} "
            f"({type(exc).__name__}); it needs the model's tokenizer.json and "
            "tokenizer_config.json (custom tokenizer code is not run)"
        ) from None
    try:
        tokenizer.get_chat_template()
    except Exception:
        raise ConfigError(
            f"TRIMPROXY_TOKENIZER=hf:{spec}: the tokenizer has no chat template; use the "
            "chat model's tokenizer files (tokenizer_config.json with chat_template, or "
            "chat_template.jinja)"
        ) from None
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise ConfigError(
            f"TRIMPROXY_TOKENIZER=hf:{spec}: no tokenizer.json (fast tokenizer) in {path}; "
            "save the tokenizer with transformers once to create it"
        )
    return tokenizer
