"""Token counters behind the ``TokenCounter`` Protocol (DESIGN section 5).

``build_counter`` picks the backend named by ``TRIMPROXY_TOKENIZER``; a backend that
cannot load raises ``ConfigError`` (a ``ValueError``) with a one-line message.
``estimate_error`` compares a count with the upstream's ``usage.prompt_tokens``.
"""

from __future__ import annotations

import logging

from proxy.settings import Settings
from proxy.tokens.approx import ApproxCounter
from proxy.tokens.counter import TokenCounter
from proxy.tokens.discover import local_tokenizer, served_names
from proxy.tokens.errors import ConfigError
from proxy.tokens.usage import estimate_error
from proxy.upstream import Upstream, UpstreamCallFailed

__all__ = ["ApproxCounter", "ConfigError", "TokenCounter", "build_counter", "estimate_error"]

log = logging.getLogger("trimproxy.tokens")


async def _auto(upstream: Upstream) -> TokenCounter:
    from proxy.tokens.vllm import VllmCounter

    names = await served_names(upstream)
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
    vllm = VllmCounter(upstream, default_model=model)
    try:
        await vllm.tokenize([{"role": "user", "content": "a"}], model)
    except UpstreamCallFailed as exc:
        if exc.status in (401, 403):
            log.warning(
                "auto: the upstream's /tokenize answered HTTP %s: set "
                "TRIMPROXY_UPSTREAM_API_KEY to the key the upstream expects",
                exc.status,
            )
    else:
        log.info("auto: counting with the upstream's /tokenize")
        return vllm
    log.warning(
        "auto: no local tokenizer for the served model%s and no /tokenize upstream: counting "
        "with the conservative approx estimate; set TRIMPROXY_TOKENIZER=hf:<dir> for exact "
        "counts (docs/tokenizers.md)",
        f" ({', '.join(names)})" if names else "",
    )
    return ApproxCounter()


async def build_counter(settings: Settings, upstream: Upstream) -> TokenCounter:
    """Build the configured counter once, at start-up; a backend that cannot load
    fails here with a ``ConfigError`` that says how to fix it, not on the first request.

    ``upstream`` is the app's one upstream client: ``auto`` and ``upstream`` ask it
    (``/v1/models``, ``/tokenize``) with its key and timeouts."""
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
        from proxy.tokens.vllm import VllmCounter

        names = await served_names(upstream)
        counter = VllmCounter(upstream, default_model=names[-1] if names else None)
        await counter.check()
        return counter
    if kind == "auto":
        return await _auto(upstream)
    raise ConfigError(f"TRIMPROXY_TOKENIZER={settings.tokenizer}: unknown tokenizer kind")
