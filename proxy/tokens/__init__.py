"""Token counters behind the ``TokenCounter`` Protocol (DESIGN section 5).

``build_counter`` picks the backend named by ``TRIMPROXY_TOKENIZER``.
"""

from __future__ import annotations

import logging

import aiohttp

from proxy.settings import Settings
from proxy.tokens.approx import ApproxCounter
from proxy.types import TokenCounter

__all__ = ["ApproxCounter", "build_counter"]

log = logging.getLogger("trimproxy.tokens")


async def build_counter(settings: Settings, http: aiohttp.ClientSession) -> TokenCounter:
    """Build the configured counter once, at start-up; a backend that cannot load
    fails here with a message that says how to fix it, not on the first request."""
    kind = settings.tokenizer.partition(":")[0]
    if kind == "approx":
        return ApproxCounter()
    if kind == "auto":
        log.warning(
            "no exact tokenizer configured: counting with the conservative approx estimate; "
            "set TRIMPROXY_TOKENIZER=hf:<dir> for exact counts"
        )
        return ApproxCounter()
    raise NotImplementedError(f"TRIMPROXY_TOKENIZER={settings.tokenizer} is not available yet")
