"""Token counters behind the ``TokenCounter`` Protocol (DESIGN section 5).

``build_counter`` picks the backend named by ``TRIMPROXY_TOKENIZER``; a backend that
cannot load raises ``ConfigError`` (a ``ValueError``) with a one-line message.
``estimate_error`` compares a count with the upstream's ``usage.prompt_tokens``.
"""

from __future__ import annotations

import logging

import aiohttp

from proxy.settings import Settings
from proxy.tokens.approx import ApproxCounter
from proxy.tokens.discover import candidates, local_tokenizer, served_models
from proxy.tokens.errors import ConfigError
from proxy.tokens.usage import estimate_error
from proxy.types import TokenCounter

__all__ = ["ApproxCounter", "ConfigError", "build_counter", "estimate_error"]

log = logging.getLogger("trimproxy.tokens")


async def _auto(settings: Settings, http: aiohttp.ClientSession) -> TokenCounter:
    from proxy.tokens.upstream import UpstreamCounter

    models = await served_models(http, settings.upstream_url)
    names = candidates(models)
    for name in names:
        path = local_tokenizer(name)
        if path is not None:
            from proxy.tokens.hf import HFCounter

            try:
                counter = await HFCounter.load(str(path))
            except ConfigError as exc:
                log.warning("auto: found %s but cannot use it: %s", path, exc)
                continue
            log.info("auto: counting with the served model's tokenizer at %s", path)
            return counter
    model = names[-1] if names else None
    upstream = UpstreamCounter(http, settings.upstream_url, default_model=model)
    try:
        await upstream.tokenize([{"role": "user", "content": "a"}], model)
    except Exception:
        pass
    else:
        log.info("auto: counting with the upstream's /tokenize")
        return upstream
    log.warning(
        "auto: no local tokenizer for the served model%s and no /tokenize upstream: counting "
        "with the conservative approx estimate; set TRIMPROXY_TOKENIZER=hf:<dir> for exact "
        "counts (docs/tokenizers.md)",
        f" ({', '.join(names)})" if names else "",
    )
    return ApproxCounter()


async def build_counter(settings: Settings, http: aiohttp.ClientSession) -> TokenCounter:
    """Build the configured counter once, at start-up; a backend that cannot load
    fails here with a ``ConfigError`` that says how to fix it, not on the first request."""
    kind, _, arg = settings.tokenizer.partition(":")
    if kind == "approx":
        return ApproxCounter()
    if kind == "hf":
        from proxy.tokens.hf import HFCounter

        return await HFCounter.load(arg)
    if kind == "tiktoken":
        from proxy.tokens.tiktoken_counter import TiktokenCounter

        return await TiktokenCounter.load(arg)
    if kind == "upstream":
        from proxy.tokens.upstream import UpstreamCounter

        names = candidates(await served_models(http, settings.upstream_url))
        counter = UpstreamCounter(
            http, settings.upstream_url, default_model=names[-1] if names else None
        )
        await counter.check()
        return counter
    if kind == "auto":
        return await _auto(settings, http)
    raise ConfigError(f"TRIMPROXY_TOKENIZER={settings.tokenizer}: unknown tokenizer kind")
