"""The Responses API over a WebSocket (``/v1/responses``), as the Codex CLI speaks it
first (docs/architecture.md §24).

The client sends text messages ``{"type": "response.create", ...the request's
fields}`` and gets each event of the answer as one text message, the JSON of the
event (what an SSE ``data:`` line carries). Each ``response.create`` is handed to the
app itself as ``POST /v1/responses`` (``proxy.loopback``) with the handshake's headers
and ``stream`` true: it gets the API keys, count, trim, sessions, admission, chains,
compaction, continuation, metrics and access line an HTTP request gets, and the engine
is spoken to over HTTP as before. A refusal is an ``{"type": "error", "status": N,
"error": {...}}`` message, the form Codex reads.

- The connection remembers its last response: a ``previous_response_id`` that names it
  is expanded here (its input, then its output), whatever ``store`` said, as OpenAI's
  WebSocket does; any other id goes to the response store as over HTTP.
- ``"generate": false`` (Codex's warm-up) answers ``response.created`` and
  ``response.completed`` with no output and no engine call; its input is remembered as
  the connection's last response.
- ``response.processed`` (Codex's acknowledgement) is read and ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.types import Message
from starlette.websockets import WebSocket, WebSocketDisconnect

from proxy.compaction.answers import response_object
from proxy.compaction.items import as_items
from proxy.dialects.conversation import json_object
from proxy.errors import InvalidRequest
from proxy.loopback import call
from proxy.types import JSONObject

PATH = "/v1/responses"


@dataclass(slots=True)
class _Last:
    """The connection's last response: its id, and its input then its output."""

    id: str
    items: list[Any]


@dataclass(slots=True)
class _Relay:
    """One answer's messages, from the app's HTTP answer to the socket."""

    socket: WebSocket
    status: int = 500
    headers: dict[bytes, bytes] = field(default_factory=dict)
    tail: bytes = b""
    whole: list[bytes] = field(default_factory=list)
    completed: JSONObject | None = None
    closed: bool = False

    async def send(self, message: JSONObject) -> None:
        """One message to the client; once it has gone, nothing more (the route sees
        its disconnect and lets the engine go)."""
        if self.closed:
            return
        try:
            await self.socket.send_text(orjson.dumps(message).decode())
        except (WebSocketDisconnect, RuntimeError):
            self.closed = True

    async def sink(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = dict(message.get("headers", []))
            return
        if message["type"] != "http.response.body":
            return
        body = message.get("body", b"")
        if self.status != 200 or not self.headers.get(b"content-type", b"").startswith(
            b"text/event-stream"
        ):
            self.whole.append(body)
            return
        buf = self.tail + body
        end = buf.rfind(b"\n\n")
        if end < 0:
            self.tail = buf
            return
        self.tail = buf[end + 2 :]
        for block in buf[:end].split(b"\n\n"):
            await self._event(block)

    async def _event(self, block: bytes) -> None:
        data = b"\n".join(
            line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:")
        )
        if not data or data == b"[DONE]":
            return
        event = json_object(data)
        if event is None:
            return
        if "type" not in event and isinstance(event.get("error"), dict):
            event = {"type": "error", "status": 502, "error": event["error"]}
        elif event.get("type") == "response.completed":
            response = event.get("response")
            self.completed = response if isinstance(response, dict) else None
        await self.send(event)

    async def end(self) -> None:
        """An answer that was not a stream: the client's error message."""
        if not self.whole:
            return
        found = json_object(b"".join(self.whole)) or {}
        error = found.get("error")
        if not isinstance(error, dict):
            error = {"message": "The proxy could not answer.", "type": "server_error"}
        message: JSONObject = {"type": "error", "status": self.status, "error": error}
        retry = self.headers.get(b"retry-after")
        if retry is not None:
            message["headers"] = {"retry-after": retry.decode("latin-1")}
        await self.send(message)


def _error(exc: InvalidRequest) -> str:
    error = {"message": exc.message, "type": exc.type, "code": exc.code, "param": exc.param}
    return orjson.dumps({"type": "error", "status": exc.status, "error": error}).decode()


def _request(text: str) -> JSONObject | None:
    """The request a ``response.create`` message carries; None for one to ignore."""
    message = json_object(text.encode())
    if message is None:
        raise InvalidRequest("A WebSocket message must be a JSON object.")
    kind = message.get("type")
    if kind == "response.processed":
        return None
    if kind != "response.create":
        raise InvalidRequest(
            f"Unsupported WebSocket message type {str(kind)[:64]!r}: send "
            "'response.create' messages.",
            param="type",
        )
    nested = message.get("response")
    body = dict(nested) if isinstance(nested, dict) else dict(message)
    body.pop("type", None)
    return body


async def responses_socket(socket: WebSocket) -> None:
    await socket.accept()
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    gone = asyncio.Event()

    async def read() -> None:
        try:
            while True:
                await queue.put(await socket.receive_text())
        except (WebSocketDisconnect, RuntimeError):
            pass
        finally:
            gone.set()
            await queue.put(None)

    reader = asyncio.get_running_loop().create_task(read())
    last: _Last | None = None
    try:
        while (text := await queue.get()) is not None:
            try:
                body = _request(text)
            except InvalidRequest as exc:
                await socket.send_text(_error(exc))
                continue
            if body is not None:
                last = await _create(socket, body, last, gone)
    except WebSocketDisconnect:
        pass
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


async def _create(
    socket: WebSocket, body: JSONObject, last: _Last | None, gone: asyncio.Event
) -> _Last | None:
    """One ``response.create``: answered, and the connection's last response after it."""
    generate = body.pop("generate", None)
    previous = body.get("previous_response_id")
    if last is not None and previous == last.id:
        body["input"] = [*last.items, *as_items(body.get("input"))]
        del body["previous_response_id"]
    items = as_items(body.get("input"))
    if generate is False:
        return await _warm_up(socket, body, items)
    body["stream"] = True
    relay = _Relay(socket)
    raw = orjson.dumps(body)
    await call(socket.app, socket.scope, PATH, raw, relay.sink, gone)
    await relay.end()
    done = relay.completed
    if done is None or not isinstance(done.get("id"), str):
        return last
    output = done.get("output")
    return _Last(done["id"], [*items, *(output if isinstance(output, list) else [])])


async def _warm_up(socket: WebSocket, body: JSONObject, items: list[Any]) -> _Last:
    response = response_object(body, [], 0)
    start = {**response, "status": "in_progress", "usage": None}
    for seq, (kind, obj) in enumerate(
        (("response.created", start), ("response.completed", response))
    ):
        event = {"type": kind, "sequence_number": seq, "response": obj}
        await socket.send_text(orjson.dumps(event).decode())
    return _Last(response["id"], items)
