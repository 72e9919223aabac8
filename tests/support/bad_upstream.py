"""A small misbehaving upstream: a raw asyncio HTTP/1.1 server on 127.0.0.1.

It answers what a well-behaved server never would, so that the proxy's handling of
a broken upstream can be tested against a real socket: statuses outside 100-599,
header values that are not Latin-1, bodies cut off mid-way (content-length or
chunked, streaming SSE or not, beyond 1 MiB), and requests that are never answered.

Run in a daemon thread with its own event loop::

    with BadUpstream() as bad:
        bad.behave("status", status=600)               # every path
        bad.behave("hang", path="/v1/models")          # one path only
        ... point the proxy at bad.url ...
        bad.requests  # [(method, path, headers, body), ...] as received

Behaviours (``behave(name, path=None, **options)``):

* ``ok``: a small vLLM-style chat completion (``/v1/models`` lists ``model``;
  ``/tokenize`` answers a count, an eighth of the body's bytes); after ``delay``
  seconds (default none).
* ``status``: ``status`` (600, 999, ...) with a small JSON body.
* ``bad_header``: 200 with a header whose value is UTF-8, not Latin-1.
* ``cut_length``: declares ``size`` bytes (default 2 MiB) of JSON, sends ``sent``
  (default half) and closes.
* ``cut_chunked``: chunked JSON, ``sent`` bytes in 64 KiB chunks, then a close
  with no last chunk.
* ``cut_sse``: an SSE stream of ``events`` chunks (``dialect`` vllm or fastchat),
  then a close with no ``[DONE]`` and no last chunk.
* ``drop``: reads the request and closes the connection without a byte of answer
  (an engine that exited while answering).
* ``close_reused``: ``ok`` for a connection's first request; a later request on the
  same kept-alive connection is read and the connection closed unanswered (an engine
  closing an idle connection just as the request went out on it).
* ``hang``: reads the request and never answers; ``hang_body``: sends the head of
  a streaming answer, ``events`` SSE events (default none) ``gap`` seconds apart,
  and then nothing.
* ``slow_sse``: a whole SSE answer, ``events`` events ``gap`` seconds apart, then
  ``[DONE]`` and the last chunk: slower in all than a read timeout, never idle as long;
  ``pad`` makes each event's text that many bytes longer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from tests.support.processes import Stack

_REASONS = {200: b"OK", 600: b"Beyond", 999: b"Nonsense"}


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class _Rule:
    name: str
    options: dict[str, Any] = field(default_factory=dict)


def chat_body(model: str = "bad-model") -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-bad",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "fine"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
        }
    ).encode()


def models_body(model: str = "bad-model", max_model_len: int = 4096) -> bytes:
    entry = {"id": model, "object": "model", "max_model_len": max_model_len}
    return json.dumps({"object": "list", "data": [entry]}).encode()


def sse_event(index: int, dialect: str, pad: int = 0) -> bytes:
    text = f"w{index} " + "x" * pad
    if dialect == "fastchat":
        chunk: dict[str, Any] = {
            "id": "chatcmpl-bad",
            "model": "bad-model",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
        }
    else:
        chunk = {
            "id": "chatcmpl-bad",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "bad-model",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
        }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


class BadUpstream(Stack):
    def __init__(self, model: str = "bad-model") -> None:
        self.model = model
        self.requests: list[Received] = []
        self._rules: dict[str | None, _Rule] = {None: _Rule("ok")}
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def behave(self, name: str, path: str | None = None, **options: Any) -> None:
        """Answer requests for ``path`` (all paths when None) this way from now on."""
        self._rules[path] = _Rule(name, options)

    def clear(self) -> None:
        self.requests.clear()
        self._rules = {None: _Rule("ok")}

    def paths(self) -> list[str]:
        return [r.path for r in self.requests]

    def start(self) -> BadUpstream:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        future.result(10)
        return self

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._server is not None:
                await self._server.wait_closed()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    # --- serving ----------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            served = 0
            while True:
                request = await _read_request(reader)
                if request is None:
                    return
                self.requests.append(request)
                path = request.path.partition("?")[0]
                rule = self._rules.get(path) or self._rules[None]
                if rule.name == "drop" or (rule.name == "close_reused" and served):
                    return
                served += 1
                keep_open = await self._answer(rule, request, writer)
                if not keep_open:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._writers.discard(writer)
            writer.transport.abort()

    async def _answer(self, rule: _Rule, request: Received, writer: asyncio.StreamWriter) -> bool:
        """Write the answer; True when the connection may serve another request."""
        opts = rule.options
        if rule.name in ("ok", "close_reused"):
            await asyncio.sleep(float(opts.get("delay", 0)))
            if request.path.startswith("/v1/models"):
                body = models_body(self.model)
            elif request.path.startswith("/tokenize"):
                body = json.dumps({"count": len(request.body) // 8 + 1}).encode()
            else:
                body = chat_body(self.model)
            await _write(writer, 200, [(b"content-type", b"application/json")], body)
            return True
        if rule.name == "status":
            status = int(opts.get("status", 600))
            await _write(writer, status, [(b"content-type", b"application/json")], b"{}")
            return True
        if rule.name == "bad_header":
            headers = [
                (b"content-type", b"application/json"),
                (b"x-model-name", "caf\u00e9 \u20ac \u4e2d".encode()),
            ]
            await _write(writer, 200, headers, chat_body(self.model))
            return True
        if rule.name == "cut_length":
            size = int(opts.get("size", 2 << 20))
            sent = int(opts.get("sent", size // 2))
            head = _head(200, [(b"content-type", b"application/json")], length=size)
            writer.write(head + _filler(sent))
            await writer.drain()
            return False
        if rule.name == "cut_chunked":
            sent = int(opts.get("sent", (2 << 20) // 2))
            writer.write(_head(200, [(b"content-type", b"application/json")], chunked=True))
            data = _filler(sent)
            for start in range(0, len(data), 1 << 16):
                piece = data[start : start + (1 << 16)]
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
            return False
        if rule.name == "cut_sse":
            dialect = str(opts.get("dialect", "vllm"))
            writer.write(_head(200, [(b"content-type", b"text/event-stream")], chunked=True))
            for index in range(int(opts.get("events", 3))):
                event = sse_event(index, dialect)
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
                await asyncio.sleep(0.01)
            return False
        if rule.name == "hang":
            await asyncio.sleep(3600)
            return False
        if rule.name in ("hang_body", "slow_sse"):
            writer.write(_head(200, [(b"content-type", b"text/event-stream")], chunked=True))
            await writer.drain()
            default_events = 0 if rule.name == "hang_body" else 3
            for index in range(int(opts.get("events", default_events))):
                await asyncio.sleep(float(opts.get("gap", 0.1)))
                event = sse_event(index, "vllm", pad=int(opts.get("pad", 0)))
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
            if rule.name == "hang_body":
                await asyncio.sleep(3600)
                return False
            done = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
            await writer.drain()
            return True
        raise ValueError(f"unknown behaviour {rule.name!r}")


def _filler(size: int) -> bytes:
    """JSON-looking bytes of exactly ``size`` (a string that never closes)."""
    prefix = b'{"id": "chatcmpl-bad", "pad": "'
    return (prefix + b"x" * max(0, size - len(prefix)))[:size]


def _head(
    status: int,
    headers: list[tuple[bytes, bytes]],
    *,
    length: int | None = None,
    chunked: bool = False,
) -> bytes:
    lines = [b"HTTP/1.1 %d %s" % (status, _REASONS.get(status, b"Status"))]
    lines.extend(name + b": " + value for name, value in headers)
    if chunked:
        lines.append(b"transfer-encoding: chunked")
    elif length is not None:
        lines.append(b"content-length: %d" % length)
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def _write(
    writer: asyncio.StreamWriter, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    writer.write(_head(status, headers, length=len(body)) + body)
    await writer.drain()


async def _read_request(reader: asyncio.StreamReader) -> Received | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _version = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = b""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip() or b"0", 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        body = b"".join(parts)
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    return Received(method, target, headers, body)
