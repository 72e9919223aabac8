"""``previous_response_id`` served from trimproxy's own store (docs/architecture.md §22).

vLLM keeps its response store off by default and, when on, keeps every response in
process memory for good; and it would rebuild a chain's history past the budget. So
the Responses route holds the conversation itself:

- ``link``: a request that continues a stored response has the chain expanded in
  front of its own input (each stored turn's input, then its output items) before it
  is counted and trimmed; ``previous_response_id`` is not forwarded, and ``store``
  goes to the engine as false. The request belongs to its chain's session.
- ``Keeping``: when the client asked to store (``store`` true, the API's default), the
  complete answer's response object, with the request's own input and a link to the
  response it continued, is kept under an id the proxy minted (sent to the engine as
  ``request_id``, rewritten into the answer where the engine answers another:
  ``proxy.chains.rename``), before the answer's last bytes go out (a client that
  sends its next turn at once finds it).
- ``retrieve_response``, ``delete_response``: ``GET``/``DELETE /v1/responses/{id}``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import Message, Receive, Scope, Send

from proxy.chains.entry import Stored
from proxy.chains.keeper import Keeper, mint
from proxy.chains.rename import SseRename, rename_json
from proxy.dependencies import Services, services
from proxy.dialects import responses
from proxy.dialects.conversation import Conversation, json_object
from proxy.errors import InvalidRequest, InvalidType
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
    rid: str = ""
    """The id the answer is stored under, minted here."""
    own: list[Any] | None = None
    """The request's own input items (what its entry holds)."""
    parent: str | None = None
    """The store key of the response it continues."""
    chain_size: int = 0
    """The bytes of the chain it continues."""


async def link(svc: Services, conv: Conversation, headers: Mapping[str, str]) -> Link | None:
    """The request as trimproxy forwards it under its response store; None for one
    that neither continues nor asks to store (forwarded as it came)."""
    body = conv.body
    assert svc.keeper is not None
    keep = store_flag(body) and svc.keeper.enabled
    previous = body.get("previous_response_id")
    if previous is None and not keep:
        if "request_id" not in body:
            return None
        # Nothing is stored, yet the engine's request id is still not the client's
        # to choose (it names the engine's request while it runs).
        out = {**body, "request_id": mint()}
        return Link(replace(conv, body=out), orjson.dumps(out), False, None)
    rid = mint()
    # The engine answers the body's request_id as the response id: the minted one,
    # never the client's (proxy.chains.rename).
    out = {**body, "store": False, "request_id": rid}
    own = input_items(conv)
    session, parent, size = None, None, 0
    if previous is not None:
        if not isinstance(previous, str) or not previous:
            raise InvalidRequest(
                "'previous_response_id' must be a response id string.",
                param="previous_response_id",
            )
        found = await svc.keeper.chain(svc.keeper.key(headers, previous), previous)
        parent, size = found.key, found.size
        del out["previous_response_id"]
        items = [*found.items, *own]
        conv = responses.with_input(replace(conv, body=out), items)
        out = conv.body
        last = found.last
        if last.session_key is not None:
            shown = last.session_shown or last.session_key
            session = Identity(last.session_key, shown, "chain")
    else:
        conv = replace(conv, body=out)
    return Link(conv, orjson.dumps(out), keep, session, rid, own, parent, size)


def store_flag(body: JSONObject) -> bool:
    """The client's ``store``: a boolean or null (the API's default, true); any other
    type is OpenAI's 400, never read as truthy or falsy."""
    value = body.get("store")
    if value is None:
        return True
    if not isinstance(value, bool):
        raise InvalidType(
            "Invalid type for 'store': expected a boolean, but got "
            f"{type(value).__name__} instead.",
            param="store",
        )
    return value


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
    items = linked.own if linked.own is not None else input_items(linked.conv)
    session_key = prepared.session_key
    shown = facts.session_id
    if linked.session is not None:
        session_key, shown = linked.session.key, linked.session.shown

    rid, parent = linked.rid, linked.parent
    facts.response_id = rid

    async def store(response: JSONObject) -> None:
        if response.get("id") != rid:
            return  # not the answer to this request: nothing is stored under a foreign id
        entry = Stored(response, items, session_key, shown, parent)
        await keeper.keep(keeper.key(headers, rid), entry, linked.chain_size)

    sse = sent.response.content_type == "text/event-stream"
    return Keeping(relay, SseCapture() if sse else JsonCapture(), store, rid)


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
        rid: str,
    ) -> None:
        self._relay = relay
        self._capture = capture
        self._store = store
        self._rid = rid
        self.status_code = relay.status_code
        self.raw_headers = relay.raw_headers
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if isinstance(self._capture, SseCapture):
            await self._relay(scope, receive, self._sse(send))
        else:
            await self._relay(scope, receive, self._json(send))

    def _sse(self, send: Send) -> Send:
        capture, store, rename = self._capture, self._store, SseRename(self._rid)

        async def keeping_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": _without_length(message["headers"])}
            elif message["type"] == "http.response.body":
                more = message.get("more_body", False)
                body = rename.feed(message.get("body", b""), more)
                found = capture.feed(body, more)
                if found is not None:
                    await store(found)
                message = {**message, "body": body}
            await send(message)

        return keeping_send

    def _json(self, send: Send) -> Send:
        """The JSON answer is held whole (up to CAPTURE_LIMIT) to rename it; a longer
        one goes on as it is, not stored."""
        store, rid = self._store, self._rid
        held: list[Message] = []
        parts: list[bytes] = []
        size = 0
        passing = False

        async def keeping_send(message: Message) -> None:
            nonlocal size, passing
            if passing or message["type"] not in ("http.response.start", "http.response.body"):
                await send(message)
                return
            if message["type"] == "http.response.start":
                held.append(message)
                return
            body = message.get("body", b"")
            size += len(body)
            parts.append(body)
            if size > CAPTURE_LIMIT:
                passing = True
                for each in held:
                    await send(each)
                await send({**message, "body": b"".join(parts)})
                return
            if message.get("more_body", False):
                return
            out, found = rename_json(b"".join(parts), rid)
            if found is not None:
                await store(found)
            for start in held:
                headers = [
                    *_without_length(start["headers"]),
                    (b"content-length", str(len(out)).encode()),
                ]
                await send({**start, "headers": headers})
            await send({**message, "body": out})

        return keeping_send


def _without_length(headers: Any) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in headers if k.lower() != b"content-length"]


async def retrieve_response(request: Request) -> Response:
    """``GET /v1/responses/{response_id}``: the response object as the client got it."""
    keeper, rid = _keeper(request)
    stored = await keeper.find(keeper.key(request.headers, rid), rid)
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


def stored_routes(path: str, tag: str) -> list[BaseRoute]:
    """``GET`` and ``DELETE`` of a response this proxy stored, under ``path``."""
    return [
        APIRoute(
            path + "/{response_id}",
            retrieve_response,
            methods=["GET"],
            summary="A response this proxy stored (previous_response_id)",
            tags=[tag],
        ),
        APIRoute(
            path + "/{response_id}",
            delete_response,
            methods=["DELETE"],
            summary="Delete a response this proxy stored",
            tags=[tag],
        ),
    ]
