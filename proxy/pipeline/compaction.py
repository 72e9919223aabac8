"""Compaction on the Responses route (docs/architecture.md §24): the three forms, one
mechanism (``items.make``), and the expansion of the items a request carries.

- ``POST /v1/responses/compact`` (``compact_response``): the ``response.compaction``
  object, the user's messages then one compaction item; no engine call.
- ``POST /v1/responses`` whose ``input`` ends in ``{"type": "compaction_trigger"}``
  (Codex's remote compaction): a response whose output is exactly one compaction
  item, as JSON or streamed; no engine call.
- ``context_management: [{"type": "compaction", "compact_threshold": N}]``: past N
  input tokens the input is compacted before the engine answers, and the item comes
  first in the answer's output.

``step`` is the one call of the Responses route: before the prepare step, so what it
forwards is counted, session-checked, trimmed and admitted like any other request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.body import load_object
from proxy.compaction.answers import ItemFirst, answer, response_object
from proxy.compaction.fold import fold, unfold
from proxy.compaction.items import as_items, carries, expand, is_trigger, make, new_id
from proxy.compaction.seal import Sealer
from proxy.compaction.summary import summarize
from proxy.dependencies import Services, services
from proxy.dialects import responses
from proxy.dialects.conversation import Conversation
from proxy.errors import InvalidRequest
from proxy.logs import request_facts
from proxy.pipeline.dialect import Dialect
from proxy.pipeline.prepare import input_tokens, note_model
from proxy.pipeline.read import read_body
from proxy.sessions.identity import client_key
from proxy.types import JSON_MEDIA_TYPE, JSONObject


@dataclass(slots=True)
class Step:
    conv: Conversation
    raw: bytes
    answer: Response | None = None
    """The proxy's own answer (a ``compaction_trigger``): nothing is forwarded."""
    first: JSONObject | None = None
    """The item the engine's answer carries first (``context_management``)."""

    def wrap(self, relay: Response) -> Response:
        return relay if self.first is None else ItemFirst(relay, self.first)


def sealer(request: Request) -> Sealer:
    found: Sealer = request.app.state.sealer
    return found


def _threshold(body: JSONObject) -> int | None:
    """``compact_threshold`` of a ``context_management`` compaction entry, if any."""
    entries = body.get("context_management")
    if entries is None:
        return None
    if not isinstance(entries, list):
        raise InvalidRequest("'context_management' must be a list.", param="context_management")
    for entry in entries:
        if isinstance(entry, dict) and entry.get("type") == "compaction":
            value = entry.get("compact_threshold")
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidRequest(
                    "'compact_threshold' must be a positive integer (input tokens).",
                    param="context_management",
                )
            return value
    return None


async def step(
    request: Request, svc: Services, dialect: Dialect, conv: Conversation, raw: bytes
) -> Step:
    """The request with its compaction items expanded, or the proxy's answer to a
    ``compaction_trigger``; unchanged when it has neither."""
    body = conv.body
    value = body.get("input")
    threshold = _threshold(body)
    # The parse saw every item on its way (``Conversation.holds_compaction``).
    held = conv.holds_compaction
    if not (carries(value) if held is None else held) and threshold is None:
        return Step(conv, raw)
    seal, key = sealer(request), client_key(request.headers)
    items = expand(seal, svc.metrics, as_items(value), key)
    out = {k: v for k, v in body.items() if k != "context_management"}
    plain = responses.with_input(replace(conv, body=out), items)
    if isinstance(value, list) and value and is_trigger(value[-1]):
        facts = request_facts(request)
        note_model(svc.settings.max_model_name_length, conv.model, facts, "responses")
        tokens = await input_tokens(svc, dialect, plain)
        summary = await summarize(request, plain.body) if svc.settings.compaction_summary else None
        _, item = make(seal, svc.metrics, items, key, "trigger", summary)
        response = response_object(body, [item], tokens)
        return Step(conv, raw, answer=answer(response, conv.stream))
    first = None
    if threshold is not None and await input_tokens(svc, dialect, plain) > threshold:
        summary = await summarize(request, plain.body) if svc.settings.compaction_summary else None
        _, first = make(seal, svc.metrics, items, key, "threshold", summary)
        plain = responses.with_input(plain, unfold([], fold(items)))
    return Step(plain, orjson.dumps(plain.body), first=first)


def compact_route(dialect: Dialect) -> Callable[[Request], Awaitable[Response]]:
    """``POST /v1/responses/compact`` for the Responses row ``dialect``."""

    async def compact(request: Request) -> Response:
        return await compact_response(request, dialect)

    return compact


async def compact_response(request: Request, dialect: Dialect) -> Response:
    """``POST /v1/responses/compact``: OpenAI's ``response.compaction`` object."""
    svc = services(request)
    raw = await read_body(request, svc.settings.max_body_bytes, svc.settings.body_timeout)
    body = load_object(raw, "'model' and 'input'")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required.", param="model")
    svc = svc.for_model(model)
    note_model(svc.settings.max_model_name_length, model, request_facts(request), "responses")
    items: list[Any] = as_items(body.get("input"))
    previous = body.get("previous_response_id")
    if previous is not None:
        if not isinstance(previous, str) or not previous or svc.keeper is None:
            raise InvalidRequest(
                "'previous_response_id' must be a response id string.",
                param="previous_response_id",
            )
        found = await svc.keeper.chain(svc.keeper.key(request.headers, previous), previous)
        items = [*found.items, *items]
    if not items:
        raise InvalidRequest("'input' (or 'previous_response_id') is required.", param="input")
    seal, key = sealer(request), client_key(request.headers)
    items = expand(seal, svc.metrics, items, key)
    plain = {"model": model, "input": items, "instructions": body.get("instructions")}
    tokens = await input_tokens(svc, dialect, responses.parse(orjson.dumps(plain)))
    summary = await summarize(request, plain) if svc.settings.compaction_summary else None
    kept, item = make(seal, svc.metrics, items, key, "endpoint", summary)
    response = response_object(body, [*kept, item], tokens)
    compacted = {
        "id": response["id"],
        "object": "response.compaction",
        "created_at": response["created_at"],
        "output": response["output"],
        "usage": response["usage"],
    }
    return Response(orjson.dumps(compacted), media_type=JSON_MEDIA_TYPE)


__all__ = ["Step", "compact_response", "compact_route", "new_id", "sealer", "step"]
