"""Before the load: is the target there, where is the engine's ``/metrics``, and
what does the engine say about its KV cache.

The engine's ``/metrics`` is ``--metrics-url`` when given, else the ``--compare``
URL's (that arm is the engine itself), else the upstream a trimproxy target names in
its ``/readyz``, else the target's own page when it is an engine (it has ``vllm:``
series). Otherwise the run stops before it starts and says which flag to pass.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from proxy.soak.options import SoakOptions, api_root
from proxy.soak.sampler import EngineReading, parse_engine_metrics


class SetupError(Exception):
    """The run cannot start; the message says what to change."""


@dataclass(frozen=True, slots=True)
class EngineInfo:
    block_size: int | None
    kv_capacity_tokens: int | None
    max_model_len: int | None

    def as_dict(self) -> dict[str, int | None]:
        return {
            "block_size": self.block_size,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "max_model_len": self.max_model_len,
        }


#: ``--metrics-url none``: an engine without ``/metrics`` (FastChat); GPU memory only.
NO_METRICS = "none"
NO_METRICS_HINT = (
    "--metrics-url none for an engine without /metrics (FastChat: GPU memory is then "
    "sampled alone, where nvidia-smi exists)"
)

_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


def _label_int(labels: dict[str, str], name: str) -> int | None:
    try:
        return int(float(labels[name]))
    except (KeyError, ValueError):
        return None


def engine_info(reading: EngineReading | None, max_model_len: int | None) -> EngineInfo:
    """As the engine reports them: ``vllm:cache_config_info`` gives the block size and
    ``kv_cache_size_tokens`` (else ``num_gpu_blocks * block_size``); ``/v1/models``
    gives ``max_model_len``."""
    labels = reading.cache_config if reading is not None and reading.cache_config else {}
    block = _label_int(labels, "block_size")
    capacity = _label_int(labels, "kv_cache_size_tokens")
    blocks = _label_int(labels, "num_gpu_blocks")
    if capacity is None and blocks is not None and block is not None:
        capacity = blocks * block
    return EngineInfo(block, capacity, max_model_len)


async def _get(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str]
) -> tuple[int, bytes]:
    timeout = aiohttp.ClientTimeout(total=10.0)
    async with session.get(url, headers=headers, timeout=timeout) as response:
        return response.status, await response.read()


async def model_window(
    session: aiohttp.ClientSession, options: SoakOptions, url: str
) -> int | None:
    """Check that ``url`` answers ``/v1/models``; its ``max_model_len`` for the model."""
    try:
        status, body = await _get(session, f"{url}/v1/models", options.headers())
    except _ERRORS as exc:
        raise SetupError(f"{url} did not answer GET /v1/models ({exc}); is it running?") from None
    if status in (401, 403):
        raise SetupError(f"{url} refused GET /v1/models ({status}): pass its key with --api-key")
    if status != 200:
        raise SetupError(f"{url} answered GET /v1/models with {status}; is it an OpenAI server?")
    try:
        entries: Any = orjson.loads(body).get("data") or []
    except (orjson.JSONDecodeError, AttributeError):
        return None
    chosen = [e for e in entries if isinstance(e, dict) and e.get("id") == options.model]
    window = (chosen or entries or [{}])[0].get("max_model_len")
    return window if isinstance(window, int) else None


async def metrics_url(session: aiohttp.ClientSession, options: SoakOptions) -> str | None:
    """The engine's ``/metrics``; ``None`` when ``--metrics-url none`` turned it off."""
    if options.metrics_url:
        return None if options.metrics_url.lower() == NO_METRICS else options.metrics_url
    if options.compare:
        return f"{api_root(options.compare)}/metrics"
    target = api_root(options.target)
    with_flag = (
        "pass the engine's metrics page with --metrics-url http://ENGINE:PORT/metrics, "
        f"or {NO_METRICS_HINT}"
    )
    try:
        status, body = await _get(session, f"{target}/readyz", options.headers())
        upstream = orjson.loads(body).get("upstream") if status in (200, 503) else None
    except (*_ERRORS, orjson.JSONDecodeError, AttributeError):
        upstream = None
    if isinstance(upstream, str) and upstream:
        return f"{api_root(upstream)}/metrics"
    try:
        status, body = await _get(session, f"{target}/metrics", options.headers())
    except _ERRORS:
        status, body = 0, b""
    if status == 200 and b"vllm:" in body:
        return f"{target}/metrics"
    raise SetupError(
        f"cannot tell where the engine's /metrics is: {target} names no upstream in /readyz "
        f"and serves no vllm: metrics itself, and there is no --compare; {with_flag}"
    )


async def first_reading(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str]
) -> EngineReading:
    """One scrape before the load, to fail early on a wrong ``--metrics-url``."""
    try:
        status, body = await _get(session, url, headers)
    except _ERRORS as exc:
        raise SetupError(f"the engine's metrics page {url} did not answer ({exc})") from None
    if status != 200:
        raise SetupError(
            f"the engine's metrics page {url} answered {status}; pass the right "
            f"--metrics-url, or {NO_METRICS_HINT}"
        )
    reading = parse_engine_metrics(body.decode("utf-8", "replace"))
    if reading.kv_usage is None:
        raise SetupError(
            f"{url} has no vllm:kv_cache_usage_perc (nor vllm:gpu_cache_usage_perc): point "
            f"--metrics-url at the vLLM engine's /metrics, or pass {NO_METRICS_HINT}"
        )
    return reading
