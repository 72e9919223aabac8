"""The ``upstream`` backend: vLLM's own ``POST /tokenize``, through ``Upstream.tokenize``
(so it carries the upstream key and the configured timeouts like every other call).

The total is exact: vLLM renders and tokenizes the messages itself. The per-message
split costs round trips, so it is built from what can be cached:

- one call per request for the total (cached by the request's digest, so a recount
  of the same list costs nothing);
- one call per message the proxy has not seen before, the message alone with
  ``add_generation_prompt: false`` (cached by the message's digest, across requests
  and sessions); a conversation that grows by two messages costs three calls, sent
  concurrently;
- a per-model, per-role constant, learned once: what counting a message alone adds
  besides the message (BOS, a default system prompt), from two probe messages
  counted alone and together (three calls the first time a role is seen).

``per_message[i]`` is the message's lone count less that constant; what is left of
the total is ``overhead``. When a template will not render a message alone (strict
role alternation), that message gets a local estimate. FastChat has no such
endpoint (see docs/tokenizers.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Sequence
from typing import Any

import orjson

from proxy.tokens.approx import ApproxCounter, estimate_message
from proxy.tokens.cache import ByteLRU
from proxy.tokens.errors import ConfigError
from proxy.tokens.shares import fit_counts
from proxy.types import JSONObject, Message, PromptCount
from proxy.upstream import Tokenized, Upstream, UpstreamCallFailed

log = logging.getLogger("trimproxy.tokens")

_PROBE_A = {"role": "user", "content": "a"}


def _refused(exc: UpstreamCallFailed) -> bool:
    """The upstream answered, and refused: the template will not render that list."""
    return exc.status is not None and exc.status != 200


def refuse_without_tokenize(exc: UpstreamCallFailed) -> None:
    """A 404 or 405 to ``POST /tokenize``: an upstream that has none (FastChat)."""
    if exc.status in (404, 405):
        raise ConfigError(
            "TRIMPROXY_TOKENIZER=upstream: the upstream has no POST /tokenize "
            f"(HTTP {exc.status}); only vLLM serves it. For FastChat set "
            "TRIMPROXY_TOKENIZER=hf:<directory with the model's tokenizer files>"
        ) from None


def _digest(*parts: Any) -> bytes:
    return hashlib.blake2b(orjson.dumps(parts), digest_size=16).digest()


class VllmCounter:
    name = "upstream"
    exact = True
    additive = False
    #: The upstream's vocabulary is not known here.
    max_token_chars = None

    def __init__(
        self,
        upstream: Upstream,
        *,
        default_model: str | None = None,
        concurrency: int = 8,
        cache_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        self._upstream = upstream
        self._model = default_model
        self._slots = asyncio.Semaphore(concurrency)
        #: The context length the last /tokenize answer reported (vLLM's max_model_len).
        self.max_model_len: int | None = None
        self._lone: ByteLRU[bytes, int] = ByteLRU(cache_bytes)
        self._totals: ByteLRU[bytes, int] = ByteLRU(cache_bytes // 8)
        self._constant: dict[tuple[str | None, str], int] = {}
        self._fallback = ApproxCounter()
        self.calls = 0

    async def tokenize(
        self,
        messages: Sequence[Message],
        model: str | None,
        *,
        tools: Sequence[JSONObject] | None = None,
        add_generation_prompt: bool = True,
    ) -> Tokenized:
        """One ``POST /tokenize``, at most ``concurrency`` at a time."""
        async with self._slots:
            self.calls += 1
            answer = await self._upstream.tokenize(
                messages, model, tools=tools, add_generation_prompt=add_generation_prompt
            )
        if answer.max_model_len is not None:
            self.max_model_len = answer.max_model_len
        return answer

    async def probe(self) -> UpstreamCallFailed | None:
        """One ``/tokenize`` call of a probe message; what went wrong, or None."""
        try:
            await self.tokenize([_PROBE_A], self._model)
        except UpstreamCallFailed as exc:
            return exc
        return None

    async def check(self) -> None:
        """Start-up probe: a 404/405 means this upstream has no ``/tokenize``."""
        exc = await self.probe()
        if exc is not None:
            refuse_without_tokenize(exc)
            if exc.status in (401, 403):
                log.warning(
                    "upstream /tokenize answered HTTP %s to a probe: set "
                    "TRIMPROXY_UPSTREAM_API_KEY to the key the upstream expects",
                    exc.status,
                )
            elif exc.status is not None:
                log.warning("upstream /tokenize answered HTTP %s to a probe", exc.status)
            else:
                log.warning(
                    "upstream not reachable at start-up; /tokenize will be tried per request"
                )

    async def _lone_count(self, message: Message, model: str | None) -> int | None:
        key = _digest(model, message)
        known = self._lone.get(key)
        if known is not None:
            return known
        try:
            answer = await self.tokenize([message], model, add_generation_prompt=False)
        except UpstreamCallFailed as exc:
            if _refused(exc):
                return None  # the template refuses it alone; estimated instead
            raise
        self._lone.put(key, answer.count)
        return answer.count

    async def _constant_for(self, model: str | None, role: str) -> int:
        """What counting a message of ``role`` alone adds besides it: two probes
        counted alone, less the two counted together. A default system prompt is
        such a constant for user turns, and none for a system message (it replaces it)."""
        key = (model, role)
        if key not in self._constant:
            a = {"role": role, "content": "a"}
            b = {"role": role, "content": "b"}
            try:
                lone_a, lone_b, pair = await asyncio.gather(
                    self._lone_count(a, model),
                    self._lone_count(b, model),
                    self.tokenize([a, b], model, add_generation_prompt=False),
                )
                both = pair.count
            except UpstreamCallFailed as exc:
                if not _refused(exc):
                    raise
                lone_a = lone_b = None
                both = 0
            if lone_a is None or lone_b is None:
                # the template will not render this role twice in a row: borrow user's
                self._constant[key] = (
                    0 if role == "user" else await self._constant_for(model, "user")
                )
            else:
                self._constant[key] = max(0, lone_a + lone_b - both)
        return self._constant[key]

    async def _total(
        self, messages: Sequence[Message], tools: Sequence[JSONObject] | None, model: str | None
    ) -> int:
        key = _digest(model, tools, messages)
        known = self._totals.get(key)
        if known is None:
            known = (await self.tokenize(messages, model, tools=tools)).count
            self._totals.put(key, known)
        return known

    async def count(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[JSONObject] | None = None,
        model: str | None = None,
    ) -> PromptCount:
        model = model or self._model
        roles = sorted({str(m.get("role")) for m in messages})
        try:
            total, constants, lone = await asyncio.gather(
                self._total(messages, tools, model),
                asyncio.gather(*(self._constant_for(model, role) for role in roles)),
                asyncio.gather(*(self._lone_count(m, model) for m in messages)),
            )
        except UpstreamCallFailed as exc:
            log.warning(
                "upstream /tokenize failed (%s); counting this request by estimate", exc.reason
            )
            return await self._fallback.count(messages, tools=tools)
        constant = dict(zip(roles, constants, strict=True))
        per = [
            estimate_message(m) if n is None else max(0, n - constant[str(m.get("role"))])
            for m, n in zip(messages, lone, strict=True)
        ]
        parts, overhead = fit_counts(per, total)
        return PromptCount(parts, overhead)

    async def count_prompt(
        self, text: str, *, model: str | None = None, special_tokens: bool = True
    ) -> int:
        """``/tokenize`` with ``prompt``: what ``/v1/completions`` encodes (cached by
        the text's digest); the estimate when the upstream fails."""
        model = model or self._model
        key = _digest(model, special_tokens, text)
        known = self._totals.get(key)
        if known is not None:
            return known
        try:
            async with self._slots:
                self.calls += 1
                answer = await self._upstream.tokenize_prompt(
                    text, model, add_special_tokens=special_tokens
                )
        except UpstreamCallFailed as exc:
            log.warning(
                "upstream /tokenize failed (%s); counting this prompt by estimate", exc.reason
            )
            return await self._fallback.count_prompt(text, special_tokens=special_tokens)
        self._totals.put(key, answer.count)
        return answer.count

    async def aclose(self) -> None:
        return None  # the HTTP session belongs to the Upstream
