"""The answers compaction gives (docs/architecture.md §24): the response object of a
``compaction_trigger`` request, as JSON or as OpenAI's stream of events, and the
engine's answer of a ``context_management`` request past its threshold with the
compaction item put first in its output (JSON and streamed alike)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from proxy.compaction.items import new_id
from proxy.dialects.conversation import json_object
from proxy.types import JSON_MEDIA_TYPE, JSONObject

SSE_MEDIA_TYPE = "text/event-stream"


def usage(input_tokens: int) -> JSONObject:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens,
    }


def response_object(body: JSONObject, output: list[Any], input_tokens: int) -> JSONObject:
    """A completed response object, as OpenAI's Responses API writes one."""
    return {
        "id": new_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "model": body.get("model"),
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": body.get("reasoning"),
        "store": False,
        "temperature": body.get("temperature"),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p"),
        "truncation": body.get("truncation") or "disabled",
        "usage": usage(input_tokens),
    }


def _event(kind: str, seq: int, **fields: Any) -> bytes:
    data = orjson.dumps({"type": kind, "sequence_number": seq, **fields})
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


def answer(response: JSONObject, stream: bool) -> Response:
    """The response object alone, or streamed as OpenAI streams one (created, in
    progress, each output item added and done, completed)."""
    if not stream:
        return Response(orjson.dumps(response), media_type=JSON_MEDIA_TYPE)
    start = {**response, "status": "in_progress", "output": [], "usage": None}
    events = [_event("response.created", 0, response=start)]
    events.append(_event("response.in_progress", 1, response=start))
    seq = 2
    for i, item in enumerate(response["output"]):
        events.append(_event("response.output_item.added", seq, output_index=i, item=item))
        events.append(_event("response.output_item.done", seq + 1, output_index=i, item=item))
        seq += 2
    events.append(_event("response.completed", seq, response=response))
    return Response(b"".join(events), media_type=SSE_MEDIA_TYPE)


class ItemFirst(Response):
    """The engine's answer with ``item`` first in its output: in the response object
    of a JSON answer; in a stream, added and done right after ``response.created``
    (where OpenAI's comes), every later output index and sequence number moved on,
    and in the final event's response."""

    def __init__(self, inner: Response, item: JSONObject) -> None:
        self._inner = inner
        self._item = item
        self.status_code = inner.status_code
        self.raw_headers = inner.raw_headers
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rewrite: Callable[[Message], Any] | None = None

        async def sending(message: Message) -> None:
            nonlocal rewrite
            if message["type"] == "http.response.start":
                ctype = dict(message.get("headers", [])).get(b"content-type", b"")
                if message["status"] != 200:
                    rewrite = send
                elif ctype.startswith(SSE_MEDIA_TYPE.encode()):
                    rewrite = _Events(self._item, send).feed
                else:
                    rewrite = _Whole(self._item, send, message).feed
                    return
                await send(message)
            elif message["type"] == "http.response.body" and rewrite is not None:
                await rewrite(message)
            else:
                await send(message)

        await self._inner(scope, receive, sending)


class _Whole:
    def __init__(self, item: JSONObject, send: Send, start: Message) -> None:
        self._item, self._send, self._start = item, send, start
        self._parts: list[bytes] = []

    async def feed(self, message: Message) -> None:
        self._parts.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        body = b"".join(self._parts)
        found = json_object(body)
        if found is not None and isinstance(found.get("output"), list):
            found["output"] = [self._item, *found["output"]]
            body = orjson.dumps(found)
        headers = [(k, v) for k, v in self._start.get("headers", []) if k != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await self._send({**self._start, "headers": headers})
        await self._send({"type": "http.response.body", "body": body})


class _Events:
    def __init__(self, item: JSONObject, send: Send) -> None:
        self._item, self._send = item, send
        self._tail = b""
        self._added = False

    async def feed(self, message: Message) -> None:
        buf = self._tail + message.get("body", b"")
        more = message.get("more_body", False)
        end = buf.rfind(b"\n\n")
        whole, self._tail = (buf[: end + 2], buf[end + 2 :]) if end >= 0 else (b"", buf)
        if not more:
            whole, self._tail = whole + self._tail, b""
        out = b"".join(self._event(block) for block in whole.split(b"\n\n") if block.strip())
        await self._send({"type": "http.response.body", "body": out, "more_body": more})

    def _event(self, block: bytes) -> bytes:
        data = b"\n".join(
            line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:")
        )
        event = json_object(data)
        if event is None or not isinstance(event.get("type"), str):
            return block + b"\n\n"
        kind = event["type"]
        shift = 2 if self._added else 0
        if isinstance(event.get("sequence_number"), int):
            event["sequence_number"] += shift
        if isinstance(event.get("output_index"), int) and self._added:
            event["output_index"] += 1
        response = event.get("response")
        if self._added and isinstance(response, dict) and isinstance(response.get("output"), list):
            response["output"] = [self._item, *response["output"]]
        out = _event(kind, event.get("sequence_number", 0), **_rest(event))
        if kind == "response.created" and not self._added:
            self._added = True
            seq = event.get("sequence_number", 0) + 1
            item = self._item
            out += _event("response.output_item.added", seq, output_index=0, item=item)
            out += _event("response.output_item.done", seq + 1, output_index=0, item=item)
        return out


def _rest(event: JSONObject) -> JSONObject:
    return {k: v for k, v in event.items() if k not in ("type", "sequence_number")}
