"""``previous_response_id`` served from trimproxy's own store (docs/architecture.md §22).

vLLM keeps its response store off by default and, when on, keeps every response in
process memory for good; and it would rebuild a chain's history past the budget. So
the Responses route holds the conversation itself:

- ``link``: a request that continues a stored response has the chain expanded in
  front of its own input (the stored conversation, then that response's output
  items) before it is counted and trimmed; ``previous_response_id`` is not forwarded,
  and ``store`` goes to the engine as false. The request belongs to its chain's session.
- ``Keeping``: when the client asked to store (``store`` true, the API's default), the
  complete answer's response object, with the request's whole input, is kept under
  the response id as the client saw it, before the answer's last bytes go out (a
  client that sends its next turn at once finds it).
- ``retrieve_response``, ``delete_response``: ``GET``/``DELETE /v1/responses/{id}``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from proxy.chains.entry import Stored
from proxy.chains.keeper import Keeper
from proxy.dependencies import Services, services
from proxy.dialects import responses
from proxy.dialects.conversation import Conversation, json_object
from proxy.errors import InvalidRequest
from proxy.logs import RequestFacts
from proxy.pipeline.forward import Sent
from proxy.pipeline.prepare import Prepared
from proxy.sessions.identity import Identity
from proxy.types import JSON_MEDIA_TYPE, JSONObject

#: The most of an answer kept to find its response object (a longer one is relayed,
#: not stored).
CAPTURE_LIMIT = 32 * 1024 * 1024


@dataclass(slots=True)
class Link:
    """A Responses request whose chain trimproxy holds."""

    conv: Conversation
    """The request to prepare: the chain expanded, ``store`` false, no previous id."""
    raw: bytes
    """Its body (the floor check's size, and what goes when nothing is trimmed)."""
    keep: bool
    """Whether the answer is to be stored (the client's ``store``)."""
    session: Identity | None
    """The chain's session, when the response it continues carries one."""


async def link(svc: Services, conv: Conversation, headers: Mapping[str, str]) -> Link | None:
    """The request as trimproxy forwards it under its response store; None for one
    that neither continues nor asks to store (forwarded as it came)."""
    body = conv.body
    keep = body.get("store") is not False
    previous = body.get("previous_response_id")
    if previous is None and not keep:
        return None
    assert svc.keeper is not None
    out = {**body, "store": False}
    session = None
    if previous is not None:
        if not isinstance(previous, str) or not previous:
            raise InvalidRequest(
                "'previous_response_id' must be a response id string.",
                param="previous_response_id",
            )
        stored = await svc.keeper.find(
            svc.keeper.key(headers, previous), previous, "previous_response_id"
        )
        del out["previous_response_id"]
        items = [*stored.items(), *input_items(conv)]
        conv = responses.with_input(replace(conv, body=out), items)
        out = conv.body
        if stored.session_key is not None:
            shown = stored.session_shown or stored.session_key
            session = Identity(stored.session_key, shown, "chain")
    else:
        conv = replace(conv, body=out)
    return Link(conv, orjson.dumps(out), keep, session)


def input_items(conv: Conversation) -> list[Any]:
    """The request's ``input`` as items (a string input is one user message). Of a
    linked request, what is stored: its whole input, the chain expanded, before
    trimming; ``instructions`` are not carried to the next response, as OpenAI's."""
    value = conv.body.get("input")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []


def keeping(
    svc: Services,
    headers: Mapping[str, str],
    linked: Link,
    relay: Response,
    sent: Sent,
    prepared: Prepared,
    facts: RequestFacts,
) -> Response:
    """The relay, storing the answer when the client asked and the engine answered 200."""
    if not linked.keep or sent.response.status != 200 or svc.keeper is None:
        return relay
    keeper = svc.keeper
    items = input_items(linked.conv)
    session_key = prepared.session_key
    shown = facts.session_id
    if linked.session is not None:
        session_key, shown = linked.session.key, linked.session.shown

    async def store(response: JSONObject) -> None:
        rid = response["id"]
        await keeper.keep(keeper.key(headers, rid), Stored(response, items, session_key, shown))

    sse = sent.response.content_type == "text/event-stream"
    return Keeping(relay, SseCapture() if sse else JsonCapture(), store)


class JsonCapture:
    """The response object of a JSON answer, at its end."""

    def __init__(self) -> None:
        self._parts: list[bytes] | None = []
        self._size = 0

    def feed(self, chunk: bytes, more: bool) -> JSONObject | None:
        if self._parts is None:
            return None
        self._size += len(chunk)
        if self._size > CAPTURE_LIMIT:
            self._parts = None
            return None
        self._parts.append(chunk)
        if more:
            return None
        return _response(json_object(b"".join(self._parts)))


class SseCapture:
    """The response object of a stream's ``response.completed`` event, once the event
    is whole (an event ends with a blank line: vLLM writes ``\\n\\n``)."""

    def __init__(self) -> None:
        self._tail = b""
        self._done = False

    def feed(self, chunk: bytes, more: bool) -> JSONObject | None:
        if self._done:
            return None
        buf = self._tail + chunk if self._tail else chunk
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._tail = buf
            self._done = len(buf) > CAPTURE_LIMIT
            return None
        self._tail = buf[end + 2 :]
        block = buf[:end]
        if b"response.completed" not in block:
            return None
        for event in block.split(b"\n\n"):
            data = b"\n".join(
                line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
            )
            parsed = json_object(data) if b"response.completed" in data else None
            if parsed is not None and parsed.get("type") == "response.completed":
                self._done = True
                found = parsed.get("response")
                return _response(found if isinstance(found, dict) else None)
        return None


def _response(value: JSONObject | None) -> JSONObject | None:
    """A response object worth storing: an id and a list of output items."""
    if value is None or not isinstance(value.get("id"), str):
        return None
    return value if isinstance(value.get("output"), list) else None


class Keeping(Response):
    """A relay whose answer's response object is stored before the bytes that carry
    it go on to the client."""

    def __init__(
        self,
        relay: Response,
        capture: JsonCapture | SseCapture,
        store: Callable[[JSONObject], Awaitable[None]],
    ) -> None:
        self._relay = relay
        self._capture = capture
        self._store = store
        self.status_code = relay.status_code
        self.raw_headers = relay.raw_headers
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        capture, store = self._capture, self._store

        async def keeping_send(message: Message) -> None:
            if message["type"] == "http.response.body":
                body = message.get("body", b"")
                found = capture.feed(body, message.get("more_body", False))
                if found is not None:
                    await store(found)
            await send(message)

        await self._relay(scope, receive, keeping_send)


async def retrieve_response(request: Request) -> Response:
    """``GET /v1/responses/{response_id}``: the response object as the client got it."""
    keeper, rid = _keeper(request)
    stored = await keeper.find(keeper.key(request.headers, rid), rid, "response_id")
    return Response(orjson.dumps(stored.response), media_type=JSON_MEDIA_TYPE)


async def delete_response(request: Request) -> Response:
    """``DELETE /v1/responses/{response_id}``: OpenAI's deletion object."""
    keeper, rid = _keeper(request)
    await keeper.forget(keeper.key(request.headers, rid), rid)
    body = {"id": rid, "object": "response", "deleted": True}
    return Response(orjson.dumps(body), media_type=JSON_MEDIA_TYPE)


def _keeper(request: Request) -> tuple[Keeper, str]:
    keeper = services(request).keeper
    assert keeper is not None  # built by the lifespan
    return keeper, request.path_params["response_id"]
