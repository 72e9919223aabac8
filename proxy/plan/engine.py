"""A running vLLM engine's own figures: ``/metrics`` and ``/v1/models``.

``vllm:cache_config_info`` is an info-style gauge whose labels are the engine's
``CacheConfig.metrics_info()``: ``num_gpu_blocks``, ``block_size`` and, in recent
releases (0.32 has it), ``kv_cache_size_tokens`` (the start-up log's "KV cache size").
``max_model_len`` comes from ``/v1/models``. Read with the standard library's HTTP
client: one GET each, at plan time only.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from proxy.plan.config import ConfigError
from proxy.vllm_metrics import CACHE_CONFIG_INFO, cache_config_labels

__all__ = ["EngineFigures", "fetch_engine", "parse_cache_config", "parse_models"]

CACHE_INFO = CACHE_CONFIG_INFO


@dataclass(frozen=True)
class EngineFigures:
    url: str
    model: str | None
    num_gpu_blocks: int
    block_size: int
    #: The engine's own figure when it reports one, else num_gpu_blocks x block_size.
    kv_cache_tokens: int
    kv_cache_tokens_reported: bool
    max_model_len: int | None
    labels: dict[str, str]


def _label_int(labels: dict[str, str], name: str) -> int | None:
    value = labels.get(name)
    if value in (None, "", "None"):
        return None
    try:
        return int(float(value))
    except ValueError:
        raise ConfigError(f"{CACHE_INFO}.{name}", f"not a number: {value!r}") from None


def parse_cache_config(text: str) -> dict[str, str]:
    """The labels of the first ``vllm:cache_config_info`` sample in a scrape."""
    engines = cache_config_labels(text)
    if engines:
        return engines[0]
    raise ConfigError(CACHE_INFO, "not in the engine's /metrics (is it a vLLM server?)")


def parse_models(body: bytes) -> tuple[str | None, int | None]:
    """The first served model's id and ``max_model_len`` from ``/v1/models``."""
    try:
        data = json.loads(body)["data"]
        first = data[0]
    except (ValueError, KeyError, IndexError, TypeError):
        raise ConfigError("/v1/models", "not an OpenAI model list") from None
    max_len = first.get("max_model_len")
    return first.get("id"), int(max_len) if isinstance(max_len, int) else None


def _get(url: str, api_key: str | None, timeout: float) -> bytes:
    request = urllib.request.Request(url)
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body: bytes = response.read()
            return body
    except urllib.error.HTTPError as exc:
        hint = " (pass --api-key or TRIMPROXY_UPSTREAM_API_KEY)" if exc.code == 401 else ""
        raise ConfigError("--from-engine", f"GET {url} answered {exc.code}{hint}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConfigError("--from-engine", f"GET {url} failed: {reason}") from None


def fetch_engine(url: str, api_key: str | None = None, timeout: float = 10.0) -> EngineFigures:
    """The engine's cache figures and context length."""
    root = url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    if not root.startswith(("http://", "https://")):
        raise ConfigError("--from-engine", f"must be an http(s) URL, not {url!r}")
    labels = parse_cache_config(_get(f"{root}/metrics", api_key, timeout).decode())
    blocks = _label_int(labels, "num_gpu_blocks")
    block_size = _label_int(labels, "block_size")
    if blocks is None or block_size is None:
        raise ConfigError(f"{CACHE_INFO}.num_gpu_blocks", "missing (engine still starting?)")
    reported = _label_int(labels, "kv_cache_size_tokens")
    model, max_len = parse_models(_get(f"{root}/v1/models", api_key, timeout))
    return EngineFigures(
        url=root,
        model=model,
        num_gpu_blocks=blocks,
        block_size=block_size,
        kv_cache_tokens=reported if reported is not None else blocks * block_size,
        kv_cache_tokens_reported=reported is not None,
        max_model_len=max_len,
        labels=labels,
    )
