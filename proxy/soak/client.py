"""One chat request the way a streaming client sends it, measured.

``stream: true`` with ``stream_options.include_usage`` gives both the time to first
token and the engine's own ``usage``. A server that refuses ``stream_options`` (some
OpenAI-compatible servers do) is asked again without it, once per arm; its answers
then carry no usage, and the records say so with ``null``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

#: How much of an error body a record keeps: enough for the message, not a page.
ERROR_SNIPPET = 300


@dataclass(slots=True)
class ChatResult:
    status: int | None
    """HTTP status; ``None`` when no answer came (connection refused, reset, timeout)."""
    error: str | None = None
    content: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency: float = 0.0
    ttft: float | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def error_key(self) -> str:
        """How ``errors_by_status`` files this failure."""
        if self.status is None:
            return "transport"
        if self.status == 200:
            return "stream"
        return str(self.status)


def _usage(chunk: dict[str, Any], result: ChatResult) -> None:
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        result.prompt_tokens = prompt if isinstance(prompt, int) else result.prompt_tokens
        if isinstance(completion, int):
            result.completion_tokens = completion


class ChatClient:
    """Chat requests to one arm's URL over one connection pool."""

    def __init__(self, session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> None:
        self.session = session
        self.url = url
        self.headers = headers
        self.include_usage = True
        self.can_count = True

    async def chat(self, body: dict[str, Any], extra_headers: dict[str, str]) -> ChatResult:
        result = await self._once(body, extra_headers)
        if (
            self.include_usage
            and result.status == 400
            and result.error is not None
            and "stream_options" in result.error
        ):
            self.include_usage = False
            result = await self._once(body, extra_headers)
        return result

    async def _once(self, body: dict[str, Any], extra_headers: dict[str, str]) -> ChatResult:
        payload = {**body, "stream": True}
        if self.include_usage:
            payload["stream_options"] = {"include_usage": True}
        headers = {**self.headers, **extra_headers, "Content-Type": "application/json"}
        start = time.monotonic()
        try:
            async with self.session.post(
                f"{self.url}/v1/chat/completions", data=orjson.dumps(payload), headers=headers
            ) as response:
                result = ChatResult(
                    status=response.status,
                    headers={k.lower(): v for k, v in response.headers.items()},
                )
                if response.status != 200:
                    text = (await response.content.read(64 * 1024)).decode("utf-8", "replace")
                    result.error = f"HTTP {response.status}: {text.strip()[:ERROR_SNIPPET]}"
                else:
                    await _read_stream(response, result, start)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            result = ChatResult(status=None, error=f"{type(exc).__name__}: {exc}"[:ERROR_SNIPPET])
        result.latency = time.monotonic() - start
        return result

    async def count(self, body: dict[str, Any]) -> int | None:
        """The prompt's size as the target counts it (vLLM's ``POST /tokenize``, which
        trimproxy passes through), or ``None`` once the target has no such route."""
        if not self.can_count:
            return None
        payload = {"model": body["model"], "messages": body["messages"]}
        payload["add_generation_prompt"] = True
        headers = {**self.headers, "Content-Type": "application/json"}
        try:
            async with self.session.post(
                f"{self.url}/tokenize", data=orjson.dumps(payload), headers=headers
            ) as response:
                if response.status != 200:
                    # No such route, or one that does not take chats: stop asking. An
                    # engine that is busy (429, 5xx) is asked again next turn.
                    self.can_count = response.status >= 500 or response.status == 429
                    return None
                answer = orjson.loads(await response.read())
        except (TimeoutError, aiohttp.ClientError, OSError, orjson.JSONDecodeError):
            return None
        count = answer.get("count") if isinstance(answer, dict) else None
        return count if isinstance(count, int) else None


async def _read_stream(response: aiohttp.ClientResponse, result: ChatResult, start: float) -> None:
    """Server-sent events until ``[DONE]``; a stream that stops short is a failure."""
    parts: list[str] = []
    finished = done = False
    async for raw in response.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            break
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            result.error = f"unreadable event: {data[:ERROR_SNIPPET].decode('utf-8', 'replace')}"
            return
        if not isinstance(chunk, dict):
            continue
        if "error" in chunk:  # an upstream failure reported as a final event
            result.error = f"error event: {orjson.dumps(chunk['error']).decode()[:ERROR_SNIPPET]}"
            return
        _usage(chunk, result)
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                if result.ttft is None:
                    result.ttft = time.monotonic() - start
                parts.append(text)
            finished = finished or choice.get("finish_reason") is not None
    result.content = "".join(parts)
    if not (done or finished):
        result.error = "the stream ended before the answer did"
