"""The ``upstream`` backend: vLLM's own ``POST /tokenize``.

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

import aiohttp
import orjson

from proxy.tokens.approx import ApproxCounter, estimate_message
from proxy.tokens.cache import ByteLRU
from proxy.tokens.errors import ConfigError
from proxy.tokens.split import fit
from proxy.types import JSONObject, Message, PromptCount

log = logging.getLogger("trimproxy.tokens")

_PROBE_A = {"role": "user", "content": "a"}


class TokenizeError(Exception):
    """/tokenize answered with an error (status kept for the caller)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _digest(*parts: Any) -> bytes:
    return hashlib.blake2b(orjson.dumps(parts), digest_size=16).digest()


class UpstreamCounter:
    name = "upstream"
    exact = True
    additive = False

    def __init__(
        self,
        http: aiohttp.ClientSession,
        upstream_url: str,
        *,
        default_model: str | None = None,
        concurrency: int = 8,
        timeout: float = 10.0,
        cache_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        self._http = http
        self._url = upstream_url.rstrip("/") + "/tokenize"
        self._model = default_model
        self._slots = asyncio.Semaphore(concurrency)
        self._timeout = aiohttp.ClientTimeout(total=timeout)
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
    ) -> tuple[int, int | None]:
        """(count, max_model_len) from one ``POST /tokenize``."""
        body: dict[str, Any] = {
            "messages": list(messages),
            "add_generation_prompt": add_generation_prompt,
        }
        if model is not None:
            body["model"] = model
        if tools:
            body["tools"] = list(tools)
        async with self._slots:
            self.calls += 1
            async with self._http.post(
                self._url,
                data=orjson.dumps(body),
                headers={"Content-Type": "application/json"},
                timeout=self._timeout,
            ) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise TokenizeError(resp.status)
        data = orjson.loads(raw)
        count = data.get("count")
        if not isinstance(count, int):
            count = len(data.get("tokens") or ())
        limit = data.get("max_model_len")
        return count, limit if isinstance(limit, int) else None

    async def check(self) -> None:
        """Start-up probe: a 404/405 means this upstream has no ``/tokenize``."""
        try:
            await self.tokenize([_PROBE_A], self._model)
        except TokenizeError as exc:
            if exc.status in (404, 405):
                raise ConfigError(
                    "TRIMPROXY_TOKENIZER=upstream: the upstream has no POST /tokenize "
                    f"(HTTP {exc.status}); only vLLM serves it. For FastChat set "
                    "TRIMPROXY_TOKENIZER=hf:<directory with the model's tokenizer files>"
                ) from None
            log.warning("upstream /tokenize answered HTTP %s to a probe", exc.status)
        except (aiohttp.ClientError, TimeoutError):
            log.warning("upstream not reachable at start-up; /tokenize will be tried per request")

    async def _lone_count(self, message: Message, model: str | None) -> int | None:
        key = _digest(model, message)
        known = self._lone.get(key)
        if known is not None:
            return known
        try:
            n, _ = await self.tokenize([message], model, add_generation_prompt=False)
        except TokenizeError:
            return None  # the template refuses it alone; estimated instead
        self._lone.put(key, n)
        return n

    async def _constant_for(self, model: str | None, role: str) -> int:
        """What counting a message of ``role`` alone adds besides it: two probes
        counted alone, less the two counted together. A default system prompt is
        such a constant for user turns, and none for a system message (it replaces it)."""
        key = (model, role)
        if key not in self._constant:
            a = {"role": role, "content": "a"}
            b = {"role": role, "content": "b"}
            try:
                lone_a, lone_b, (both, _) = await asyncio.gather(
                    self._lone_count(a, model),
                    self._lone_count(b, model),
                    self.tokenize([a, b], model, add_generation_prompt=False),
                )
            except TokenizeError:
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
            known, _ = await self.tokenize(messages, model, tools=tools)
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
        except (TokenizeError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning(
                "upstream /tokenize failed (%s); counting this request by estimate",
                type(exc).__name__,
            )
            return await self._fallback.count(messages, tools=tools)
        constant = dict(zip(roles, constants, strict=True))
        per = [
            estimate_message(m) if n is None else max(0, n - constant[str(m.get("role"))])
            for m, n in zip(messages, lone, strict=True)
        ]
        parts, overhead = fit(per, total)
        return PromptCount(parts, overhead)

    async def aclose(self) -> None:
        return None  # the HTTP session belongs to the app
