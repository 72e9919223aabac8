"""Token counters behind the ``TokenCounter`` Protocol (docs/architecture.md §8).

``build_counter`` picks the backend named by ``TRIMPROXY_TOKENIZER``; a backend that
cannot load raises ``ConfigError`` (a ``ValueError``) with a one-line message.
``estimate_error`` compares a count with the upstream's ``usage.prompt_tokens``.
"""

from __future__ import annotations

import logging

from proxy.logs import adopt_transformers_logging
from proxy.settings import Settings
from proxy.tokens.approx import ApproxCounter
from proxy.tokens.auto import AutoCounter, resolve_auto
from proxy.tokens.counter import FallbackHook, TokenCounter
from proxy.tokens.discover import served_names
from proxy.tokens.errors import ConfigError
from proxy.tokens.usage import estimate_error
from proxy.upstream import Upstream

__all__ = ["ApproxCounter", "ConfigError", "TokenCounter", "build_counter", "estimate_error"]

log = logging.getLogger("trimproxy.tokens")


async def build_counter(
    settings: Settings, upstream: Upstream, on_fallback: FallbackHook | None = None
) -> TokenCounter:
    """Build the configured counter once, at start-up; a backend that cannot load
    fails here with a ``ConfigError`` that says how to fix it, not on the first request.

    ``upstream`` is the app's one upstream client: ``auto`` and ``upstream`` ask it
    (``/v1/models``, ``/tokenize``) with its key and timeouts. ``on_fallback``: counts
    what the ``/tokenize`` counter leaves to the estimate, by reason."""
    kind, _, arg = settings.tokenizer.partition(":")
    if kind == "approx":
        return ApproxCounter()
    if kind == "hf":
        from proxy.tokens.hf import HFCounter

        adopt_transformers_logging()  # its lines as JSON, before it is imported
        return await HFCounter.load(arg)
    if kind == "tiktoken":
        from proxy.tokens.tiktoken_counter import TiktokenCounter

        return await TiktokenCounter.load(arg)
    if kind == "upstream":
        from proxy.tokens.vllm import VllmCounter

        names = await served_names(upstream)
        model = names[-1] if names else None
        counter = VllmCounter(upstream, default_model=model, on_fallback=on_fallback)
        await counter.check()
        return counter
    if kind == "auto":
        picked, final = await resolve_auto(upstream, on_fallback)
        # Started before its upstream: resolved again once the upstream answers.
        return picked if final else AutoCounter(upstream, picked, on_fallback=on_fallback)
    raise ConfigError(f"TRIMPROXY_TOKENIZER={settings.tokenizer}: unknown tokenizer kind")
