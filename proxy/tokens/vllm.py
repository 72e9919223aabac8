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

What one count may cost the engine is bounded (docs/tokenizers.md): ``MAX_CALLS``
calls at most, whatever the request holds. The total is always asked (one call,
exact); a request with more than ``NEW_MESSAGES`` messages not seen before asks
none of them alone, and its split is the local estimate scaled into that exact
total (``trimproxy_token_count_fallbacks_total{reason="bound"}``), as is that of
the messages of a role past ``NEW_ROLES`` new ones. And a count shares the read
timeout: its calls together get ``TRIMPROXY_READ_TIMEOUT`` at most, after which the
request is counted by the estimate (``reason="timeout"``), and so is every count for
``REST`` seconds after, so a hung engine costs a request one read timeout, not one
for its count and one more for its answer (the forward gets what is left of it:
``proxy.upstream.Transport.send``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import orjson

from proxy.tokens.approx import ApproxCounter, estimate_message
from proxy.tokens.cache import ByteLRU
from proxy.tokens.counter import FallbackHook
from proxy.tokens.errors import ConfigError
from proxy.tokens.shares import fit_counts
from proxy.types import JSONObject, Message, PromptCount
from proxy.upstream import Tokenized, Upstream, UpstreamCallFailed

log = logging.getLogger("trimproxy.tokens")

_PROBE_A = {"role": "user", "content": "a"}
#: A count asks the messages it has not seen before one by one only when there are
#: at most this many; with more, none (the total is still exact: docs/tokenizers.md).
NEW_MESSAGES = 16
#: Roles not seen before whose constant one count learns; others' messages estimated.
NEW_ROLES = 4
#: The most calls learning one role's constant can take: three for the role, three
#: more for ``user``'s when the template refuses the role twice in a row.
_ROLE_CALLS = 6
#: The most ``/tokenize`` calls one count makes, whatever the request holds.
MAX_CALLS = 1 + NEW_MESSAGES + NEW_ROLES * _ROLE_CALLS
#: Seconds after a count that timed out during which counts go to the estimate
#: without asking (an engine that hangs is not asked again by every request).
REST = 5.0


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
        on_fallback: FallbackHook | None = None,
    ) -> None:
        """``on_fallback``: counts what went to the estimate, by reason
        (``trimproxy_token_count_fallbacks_total``)."""
        self._upstream = upstream
        self._on_fallback = on_fallback
        self._time_limit = upstream.transport.read_timeout
        self._rest_until = 0.0
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

    async def _lone_count(
        self, message: Message, model: str | None, key: bytes | None = None
    ) -> int | None:
        key = key or _digest(model, message)
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
        now = time.monotonic()
        if now < self._rest_until:
            return await self._estimate("timeout", messages, tools)
        try:
            async with asyncio.timeout(self._time_limit):
                return await self._exact(messages, tools, model)
        except TimeoutError:
            why = "timeout"
        except UpstreamCallFailed as exc:
            timed_out = exc.status is None and "Timeout" in exc.reason
            why = "timeout" if timed_out else "error"
            if not timed_out:
                log.warning(
                    "upstream /tokenize failed (%s); counting this request by estimate",
                    exc.reason,
                )
        if why == "timeout":
            if self._rest_until < now:
                log.warning(
                    "upstream /tokenize gave no answer within %g s (TRIMPROXY_READ_TIMEOUT); "
                    "counting by estimate for the next %g s",
                    self._time_limit,
                    REST,
                )
            self._rest_until = time.monotonic() + REST
        return await self._estimate(why, messages, tools)

    async def _estimate(
        self, why: str, messages: Sequence[Message], tools: Sequence[JSONObject] | None
    ) -> PromptCount:
        if self._on_fallback is not None:
            self._on_fallback(why)
        return await self._fallback.count(messages, tools=tools)

    async def _exact(
        self, messages: Sequence[Message], tools: Sequence[JSONObject] | None, model: str | None
    ) -> PromptCount:
        """The exact total and the split, in at most ``MAX_CALLS`` calls: up to
        ``NEW_ROLES`` roles not seen before, and the messages not seen before when
        there are at most ``NEW_MESSAGES`` of them; the rest of the split estimated."""
        roles = sorted({str(m.get("role")) for m in messages})
        known = [r for r in roles if (model, r) in self._constant]
        asked_roles = known + [r for r in roles if (model, r) not in self._constant][:NEW_ROLES]
        keys = [_digest(model, m) for m in messages]
        unseen = {k: m for k, m in zip(keys, messages, strict=True) if self._lone.get(k) is None}
        bounded = len(asked_roles) < len(roles) or len(unseen) > NEW_MESSAGES
        wanted = unseen if len(unseen) <= NEW_MESSAGES else {}
        total, constants, lone = await asyncio.gather(
            self._total(messages, tools, model),
            asyncio.gather(*(self._constant_for(model, role) for role in asked_roles)),
            asyncio.gather(*(self._lone_count(m, model, key) for key, m in wanted.items())),
        )
        if bounded and self._on_fallback is not None:
            self._on_fallback("bound")
        constant = dict(zip(asked_roles, constants, strict=True))
        asked = dict(zip(wanted, lone, strict=True))
        per: list[int] = []
        for m, key in zip(messages, keys, strict=True):
            role = str(m.get("role"))
            n = asked[key] if key in asked else self._lone.get(key)
            if role not in constant or n is None:
                per.append(estimate_message(m))
            else:
                per.append(max(0, n - constant[role]))
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
