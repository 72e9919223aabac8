"""``GET /v1/responses/{id}/input_items``: the input items a stored response's own
request sent (not the chain it continued), in
OpenAI's list shape (docs/architecture.md §24): ``{"object": "list", "data",
"first_id", "last_id", "has_more"}``, newest first unless ``order=asc``, ``limit``
(1 to 100, 20 by default) items after the one ``after`` names.

An item the client sent without an ``id`` gets one derived from the response id and
its place, the same on every read; a string content becomes its ``input_text`` part.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.dependencies import services
from proxy.errors import InvalidRequest
from proxy.types import JSON_MEDIA_TYPE, JSONObject

DEFAULT_LIMIT = 20
MAX_LIMIT = 100


def listed(response_id: str, index: int, item: Any) -> JSONObject:
    """One input item as the list shows it."""
    out: JSONObject = dict(item) if isinstance(item, dict) else {"role": "user", "content": item}
    out.setdefault("type", "message")
    if out["type"] == "message" and isinstance(out.get("content"), str):
        out["content"] = [{"type": "input_text", "text": out["content"]}]
    if not isinstance(out.get("id"), str):
        digest = hashlib.blake2b(f"{response_id}\0{index}".encode(), digest_size=16)
        out["id"] = f"msg_{digest.hexdigest()}"
    return out


def _limit(value: str | None) -> int:
    if value is None:
        return DEFAULT_LIMIT
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequest(f"'limit' must be an integer from 1 to {MAX_LIMIT}.", param="limit")
    return limit


def page(items: list[JSONObject], order: str, limit: int, after: str | None) -> JSONObject:
    if order not in ("asc", "desc"):
        raise InvalidRequest("'order' must be 'asc' or 'desc'.", param="order")
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise InvalidRequest(f"No input item with id '{after[:64]}'.", param="after")
        ordered = ordered[ids.index(after) + 1 :]
    data = ordered[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(ordered) > limit,
    }


async def input_items(request: Request) -> Response:
    keeper = services(request).keeper
    assert keeper is not None  # built by the lifespan
    rid = request.path_params["response_id"]
    stored = await keeper.find(keeper.key(request.headers, rid), rid)
    items = [listed(rid, i, item) for i, item in enumerate(stored.input)]
    query = request.query_params
    body = page(items, query.get("order", "desc"), _limit(query.get("limit")), query.get("after"))
    return Response(orjson.dumps(body), media_type=JSON_MEDIA_TYPE)
