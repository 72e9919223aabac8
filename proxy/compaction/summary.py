"""The engine's summary of what a compaction folds, when the operator asks for one
(``TRIMPROXY_COMPACTION_SUMMARY``; docs/architecture.md §24): a Responses request
handed to the proxy itself (``proxy.loopback``), so it is counted, trimmed to the
budget, admitted and metered like a client's. A failed one leaves the item without
a summary: the folded items are in it all the same."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from starlette.requests import Request

from proxy.compaction.fold import fold
from proxy.loopback import fetch
from proxy.types import JSONObject

log = logging.getLogger("trimproxy.compaction")

SUMMARY_TOKENS = 512
_ASK = (
    "Summarize the conversation above for whoever continues it: the task, what was "
    "done and found, what is left. Be brief and concrete."
)


async def summarize(request: Request, body: JSONObject) -> str | None:
    items: list[Any] = fold(body.get("input") or [])
    inner = {
        "model": body.get("model"),
        "instructions": body.get("instructions"),
        "input": [*items, {"type": "message", "role": "user", "content": _ASK}],
        "stream": False,
        "store": False,
        "max_output_tokens": SUMMARY_TOKENS,
    }
    status, raw = await fetch(request.app, request.scope, "/v1/responses", orjson.dumps(inner))
    if status != 200:
        log.warning("compaction summary: the engine answered %d; the item has none", status)
        return None
    return _text(raw)


def _text(raw: bytes) -> str | None:
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    texts: list[str] = [
        part["text"]
        for item in answer.get("output") or []
        if isinstance(item, dict) and item.get("type") == "message"
        for part in item.get("content") or []
        if isinstance(part, dict) and isinstance(part.get("text"), str)
    ]
    return "\n".join(texts) or None
