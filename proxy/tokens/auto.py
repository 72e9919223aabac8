"""``TRIMPROXY_TOKENIZER=auto``: pick the counter from what the upstream serves, and pick
again while the upstream cannot be reached.

``resolve_auto`` decides once (``proxy.tokens.discover``: a local tokenizer of the
served model, else the upstream's ``/tokenize``, else ``approx``). A proxy started
before its upstream (the usual order under compose and Kubernetes) gets ``approx``
from it only because nobody answered; ``AutoCounter`` then counts with that while it
asks again in the background, at most every ``retry_after`` seconds and only when
requests come, and switches (logged once) as soon as the upstream answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

from proxy.logs import adopt_transformers_logging
from proxy.tokens.approx import ApproxCounter
from proxy.tokens.counter import FallbackHook, TokenCounter
from proxy.tokens.discover import local_tokenizer, served_names
from proxy.tokens.errors import ConfigError
from proxy.types import JSONObject, Message, PromptCount
from proxy.upstream import Upstream, UpstreamCallFailed

log = logging.getLogger("trimproxy.tokens")


async def resolve_auto(
    upstream: Upstream, on_fallback: FallbackHook | None = None
) -> tuple[TokenCounter, bool]:
    """The counter ``auto`` picks now, and whether that is final: False when it fell
    back to ``approx`` only because the upstream could not be reached."""
    from proxy.tokens.vllm import VllmCounter

    names = await served_names(upstream)
    for name in names:
        path = local_tokenizer(name)
        if path is not None:
            from proxy.tokens.hf import HFCounter

            adopt_transformers_logging()  # its lines as JSON, before it is imported
            try:
                counter = await HFCounter.load(str(path))
            except ConfigError as exc:
                log.warning("auto: found %s but cannot use it: %s", path, exc)
                continue
            log.info("auto: counting with the served model's tokenizer at %s", path)
            return counter, True
    model = names[-1] if names else None
    vllm = VllmCounter(upstream, default_model=model, on_fallback=on_fallback)
    try:
        await vllm.tokenize([{"role": "user", "content": "a"}], model)
    except UpstreamCallFailed as exc:
        reached = exc.status is not None
        if exc.status in (401, 403):
            log.warning(
                "auto: the upstream's /tokenize answered HTTP %s: set "
                "TRIMPROXY_UPSTREAM_API_KEY to the key the upstream expects",
                exc.status,
            )
    else:
        log.info("auto: counting with the upstream's /tokenize")
        return vllm, True
    if not reached and not names:
        log.warning(
            "auto: the upstream at %s does not answer yet: counting with the conservative "
            "approx estimate until it does, then with its tokenizer",
            upstream.base_url,
        )
        return ApproxCounter(), False
    log.warning(
        "auto: no local tokenizer for the served model%s and no /tokenize upstream: counting "
        "with the conservative approx estimate; set TRIMPROXY_TOKENIZER=hf:<dir> for exact "
        "counts (docs/tokenizers.md)",
        f" ({', '.join(names)})" if names else "",
    )
    return ApproxCounter(), True


class AutoCounter:
    """``auto`` while its upstream is still down: ``approx`` until it answers."""

    def __init__(
        self,
        upstream: Upstream,
        current: TokenCounter,
        *,
        retry_after: float = 2.0,
        on_fallback: FallbackHook | None = None,
    ) -> None:
        self._upstream = upstream
        self._on_fallback = on_fallback
        self._current = current
        self.name = current.name
        self.exact = current.exact
        self.additive = current.additive
        self.max_token_chars: int | None = None
        self._adopt(current)
        self._retry_after = retry_after
        self._next_try = time.monotonic() + retry_after
        self._task: asyncio.Task[None] | None = None
        self._settled = False

    def _adopt(self, counter: TokenCounter) -> None:
        self._current = counter
        self.name = counter.name
        self.exact = counter.exact
        self.additive = counter.additive
        self.max_token_chars = counter.max_token_chars

    async def count(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[JSONObject] | None = None,
        model: str | None = None,
    ) -> PromptCount:
        if not self._settled and self._task is None and time.monotonic() >= self._next_try:
            # In the background: a request never waits for an upstream that may be down.
            self._task = asyncio.create_task(self._resolve(), name="trimproxy-auto-tokenizer")
        return await self._current.count(messages, tools=tools, model=model)

    async def count_prompt(
        self, text: str, *, model: str | None = None, special_tokens: bool = True
    ) -> int:
        return await self._current.count_prompt(text, model=model, special_tokens=special_tokens)

    async def _resolve(self) -> None:
        try:
            counter, final = await resolve_auto(self._upstream, self._on_fallback)
        except Exception:  # a tokenizer that fails to load: keep approx, try again later
            log.exception("auto: resolving the tokenizer again failed")
            counter, final = ApproxCounter(), False
        finally:
            self._task = None
            self._next_try = time.monotonic() + self._retry_after
        if not final:
            await counter.aclose()
            return
        old, self._settled = self._current, True
        self._adopt(counter)
        log.warning(
            "auto: the upstream at %s answers now: counting with %s instead of %s",
            self._upstream.base_url,
            counter.name,
            old.name,
        )
        await old.aclose()

    async def aclose(self) -> None:
        task = self._task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._current.aclose()
