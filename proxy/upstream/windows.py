"""The served models' context windows, learned from the upstream and bounded by it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from proxy.settings import Settings
from proxy.upstream.client import Upstream
from proxy.upstream.flight import Flight

log = logging.getLogger("trimproxy.upstream")


class ContextWindows:
    """The served models' context lengths, learned from the upstream and bounded by it.

    Only names the upstream lists (``Upstream.models()``, fetched again every
    ``TRIMPROXY_MODELS_REFRESH`` seconds) get a window of their own: vLLM's
    ``max_model_len`` from the listing, or FastChat's ``contextLength`` from
    ``/api/v1/token_check``, asked once per listed name and kept as long as the list
    (a name it could not learn is asked again after ``TRIMPROXY_MODELS_RETRY``). A name
    the upstream does not list gets the window of the one served model when there is
    exactly one (an alias, or a name the upstream will refuse itself), else none: then
    only ``TRIMPROXY_MAX_PROMPT_TOKENS`` bounds it, and the upstream answers it the way
    it answers any unknown model. So neither the memory kept here nor the calls made
    upstream grow with the names clients send.
    """

    def __init__(
        self,
        upstream: Upstream,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._upstream = upstream
        ttl, retry = settings.models_refresh, settings.models_retry
        # FastChat's per-model answers, for listed names only.
        self._checked: Flight[str, int | None] = Flight(lambda n: ttl if n else retry, clock)
        self._quiet_until = 0.0

    async def get(self, model: str) -> int | None:
        served = await self._upstream.models()
        entry = next((e for e in served if e.id == model), None)
        if entry is None and len(served) == 1:
            entry = served[0]
        if entry is None:
            self._warn(model if served else None)
            return None
        if entry.max_model_len is not None:
            return entry.max_model_len
        # No longer served: the upstream's list bounds what is kept here.
        self._checked.keep_only({e.id for e in served})
        name = entry.id
        length = await self._checked.get(name, lambda: self._upstream.token_check(name))
        if length is None:
            self._warn(name)
        return length

    def _warn(self, model: str | None) -> None:
        """One warning a minute at most: the names come from clients."""
        now = time.monotonic()
        if now < self._quiet_until:
            return
        self._quiet_until = now + 60.0
        if model is None:
            log.warning(
                "the upstream listed no models (GET /v1/models failed or was empty); prompts "
                "are bounded only by TRIMPROXY_CONTEXT_WINDOW or TRIMPROXY_MAX_PROMPT_TOKENS"
            )
        else:
            log.warning(
                "could not learn the context window of model %r from the upstream; "
                "set TRIMPROXY_CONTEXT_WINDOW (or TRIMPROXY_MAX_PROMPT_TOKENS) to bound prompts",
                model[:100],
            )
