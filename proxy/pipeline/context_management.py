"""Anthropic context editing on ``/v1/messages``, the request path's side (docs/dialects.md,
"Context editing"; the edits themselves: ``proxy.dialects.context_editing``).

A request's ``context_management`` is applied before the budget trim, with or without
the ``anthropic-beta: context-management-2025-06-27`` header, and never forwarded: the
engine gets the edited ``messages`` and no ``context_management``. The answer carries
``context_management.applied_edits`` where Anthropic puts it: on the message of a JSON
answer, on the ``message_delta`` event of a stream. Nothing here runs for a request
without the field.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Message as AsgiMessage
from starlette.types import Receive, Scope, Send

from proxy.dependencies import Services
from proxy.dialects import context_editing
from proxy.dialects.context_editing import FIELD, Edited
from proxy.dialects.conversation import Conversation
from proxy.logs import RequestFacts
from proxy.pipeline.dialect import Dialect, Edit
from proxy.pipeline.prepare import input_tokens
from proxy.types import JSONObject


async def _edited(svc: Services, dialect: Dialect, conv: Conversation) -> Edited | None:
    """The request's edits applied to its messages; None when it asks for none."""
    edits = context_editing.parse(conv.body)
    if edits is None:
        return None
    head = conv.items[: conv.head]

    async def count(messages: list[JSONObject]) -> int:
        # System and tools as the request has them: the edits touch neither.
        return await input_tokens(svc, dialect, replace(conv, items=[*head, *messages]))

    return await context_editing.apply(edits, conv.items[conv.head :], count)


async def edit_message(
    svc: Services, dialect: Dialect, conv: Conversation, facts: RequestFacts
) -> Edit | None:
    """The request with its context edits applied, before the shared prepare step
    (the Messages row's ``edit``); None when it asks for none."""
    edited = await _edited(svc, dialect, conv)
    if edited is None:
        return None
    body = {key: value for key, value in conv.body.items() if key != FIELD}
    body["messages"] = edited.messages
    # The items keep their roles: an edit changes blocks' content, never a message's kind.
    sent = replace(conv, body=body, items=[*conv.items[: conv.head], *edited.messages])
    _observe(svc, edited)
    facts.context_edits = edited.applied
    value: JSONObject = {"applied_edits": edited.applied}
    stream = conv.stream

    def wrap(relay: Response) -> Response:
        return WithContextManagement(relay, value, stream)

    return Edit(conv=sent, raw=orjson.dumps(body), wrap=wrap)


def _cleared(entry: JSONObject) -> int:
    value = entry.get("cleared_tool_uses", entry.get("cleared_thinking_turns", 0))
    return value if isinstance(value, int) else 0


def _observe(svc: Services, edited: Edited) -> None:
    metrics = svc.metrics
    for entry in edited.applied:
        kind = entry["type"]
        metrics.context_edits.labels(kind).inc()
        metrics.context_edit_cleared.labels(kind).inc(_cleared(entry))
        metrics.context_edit_cleared_tokens.labels(kind).inc(entry["cleared_input_tokens"])


async def count_message(svc: Services, dialect: Dialect, conv: Conversation) -> tuple[int, int]:
    """``(input_tokens, original_input_tokens)`` of ``/v1/messages/count_tokens``: the
    prompt's count after the request's context edits, and before them."""
    edited = await _edited(svc, dialect, conv)
    if edited is None:
        tokens = await input_tokens(svc, dialect, conv)
        return tokens, tokens
    return edited.tokens, edited.original_tokens


class WithContextManagement(Response):
    """The relayed answer with ``context_management`` added where Anthropic puts it: a
    JSON message's top-level field (the body is held until it is whole, to rewrite it),
    a stream's ``message_delta`` event (each event passes as soon as it is whole). An
    answer that is not a 200 passes unchanged."""

    def __init__(self, inner: Response, value: JSONObject, stream: bool) -> None:
        self._inner = inner
        self._value = value
        self._stream = stream
        self.status_code = inner.status_code
        self.raw_headers = inner.raw_headers
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        edit = _StreamEdit(self._value, send) if self._stream else _JsonEdit(self._value, send)
        await self._inner(scope, receive, edit.send)


class _JsonEdit:
    def __init__(self, value: JSONObject, send: Send) -> None:
        self._value, self._send = value, send
        self._start: AsgiMessage | None = None
        self._parts: list[bytes] = []

    async def send(self, message: AsgiMessage) -> None:
        if message["type"] == "http.response.start":
            if message["status"] != 200:
                await self._send(message)
            else:
                self._start = message
            return
        if self._start is None or message["type"] != "http.response.body":
            await self._send(message)
            return
        self._parts.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        body = _with_field(b"".join(self._parts), self._value)
        start, self._start = self._start, None
        headers = [(k, v) for k, v in start["headers"] if k != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await self._send({**start, "headers": headers})
        await self._send({"type": "http.response.body", "body": body})


def _with_field(body: bytes, value: JSONObject) -> bytes:
    try:
        answer: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(answer, dict) or answer.get("type") != "message":
        return body
    answer[FIELD] = value
    return orjson.dumps(answer)


class _StreamEdit:
    def __init__(self, value: JSONObject, send: Send) -> None:
        self._value, self._send = value, send
        self._pending = b""
        self._done = False

    async def send(self, message: AsgiMessage) -> None:
        if message["type"] != "http.response.body" or self._done:
            if message["type"] == "http.response.start" and message["status"] != 200:
                self._done = True
            await self._send(message)
            return
        data = self._pending + message.get("body", b"")
        more = message.get("more_body", False)
        end = data.rfind(b"\n\n")
        cut = (end + 2 if end >= 0 else 0) if more else len(data)
        whole, self._pending = data[:cut], data[cut:]
        if b"message_delta" in whole:
            events = [self._event(e) for e in whole.split(b"\n\n")]
            whole = b"\n\n".join(events)
            if self._done and self._pending:  # one message_delta per answer: the rest passes
                whole, self._pending = whole + self._pending, b""
        if whole or not more:
            await self._send({**message, "body": whole})

    def _event(self, event: bytes) -> bytes:
        lines = event.split(b"\n")
        for i, line in enumerate(lines):
            if line.startswith(b"data:"):
                try:
                    data: Any = orjson.loads(line[5:])
                except orjson.JSONDecodeError:
                    return event
                if isinstance(data, dict) and data.get("type") == "message_delta":
                    data[FIELD] = self._value
                    self._done = True
                    lines[i] = b"data: " + orjson.dumps(data)
        return b"\n".join(lines)
