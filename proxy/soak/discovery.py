"""Before the load: is the target there, where are the engines' ``/metrics``, and
what does the engine say about its KV cache.

The engines' pages are ``--engine-metrics`` (any number) and ``--metrics-url`` when
given; else every engine of a trimproxy target's upstream when its ``/readyz`` names
several (a comma-separated list, or a ``dns+http://NAME:PORT`` name: each of its
addresses, resolved here the way the system resolves names); else the ``--compare``
URL's (that arm is the engine itself); else the one upstream ``/readyz`` names; else
the target's own page when it is an engine (it has ``vllm:`` series). Otherwise the
run stops before it starts and says which flag to pass.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from proxy.engines.discovery import DiscoveryError, parse_dns_url
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


async def resolve_engines(upstream: str) -> list[str]:
    """The engines' root URLs of a proxy's upstream setting: each entry of a comma list,
    and every address of a ``dns+http(s)://NAME:PORT`` entry."""
    engines: list[str] = []
    loop = asyncio.get_running_loop()
    for entry in (part.strip() for part in upstream.split(",")):
        if not entry:
            continue
        try:
            name = parse_dns_url(entry)
        except DiscoveryError as exc:
            raise SetupError(f"the proxy's upstream {exc}") from None
        if name is None:
            engines.append(api_root(entry))
            continue
        try:
            found = await loop.getaddrinfo(name.host, name.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise SetupError(
                f"the proxy's upstream {entry} does not resolve here ({exc}); pass each "
                "engine's page with --engine-metrics http://ENGINE:PORT/metrics"
            ) from None
        addresses = sorted({str(info[4][0]) for info in found})
        engines.extend(api_root(name.engine_url(a)) for a in addresses)
    return list(dict.fromkeys(engines))


async def _readyz_engines(session: aiohttp.ClientSession, options: SoakOptions) -> list[str]:
    """The engines a trimproxy target's ``/readyz`` names as its upstream; ``[]`` when
    the target is no trimproxy (or says nothing)."""
    try:
        status, body = await _get(session, f"{api_root(options.target)}/readyz", options.headers())
        upstream = orjson.loads(body).get("upstream") if status in (200, 503) else None
    except (*_ERRORS, orjson.JSONDecodeError, AttributeError):
        upstream = None
    return await resolve_engines(upstream) if isinstance(upstream, str) and upstream else []


async def metrics_urls(session: aiohttp.ClientSession, options: SoakOptions) -> list[str]:
    """The engines' ``/metrics`` pages; ``[]`` when ``--metrics-url none`` turned them off."""
    given = [*options.engine_metrics]
    if options.metrics_url:
        if options.metrics_url.lower() == NO_METRICS:
            if given:
                raise SetupError(
                    "--metrics-url none turns engine metrics off; drop it or --engine-metrics"
                )
            return []
        given.insert(0, options.metrics_url)
    if given:
        return list(dict.fromkeys(given))
    engines = await _readyz_engines(session, options)
    if len(engines) > 1:  # the proxy routes over several: the target arm loads them all
        return [f"{engine}/metrics" for engine in engines]
    if options.compare:
        return [f"{api_root(options.compare)}/metrics"]
    if engines:
        return [f"{engines[0]}/metrics"]
    target = api_root(options.target)
    try:
        status, body = await _get(session, f"{target}/metrics", options.headers())
    except _ERRORS:
        status, body = 0, b""
    if status == 200 and b"vllm:" in body:
        return [f"{target}/metrics"]
    raise SetupError(
        f"cannot tell where the engine's /metrics is: {target} names no upstream in /readyz "
        f"and serves no vllm: metrics itself, and there is no --compare; pass each engine's "
        f"metrics page with --engine-metrics http://ENGINE:PORT/metrics (--metrics-url for "
        f"one), or {NO_METRICS_HINT}"
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
