"""Compaction items made and expanded (docs/architecture.md §24).

``make``: the items an input compacts to, the user's messages then one ``compaction``
item sealing the whole input in its folded form (``fold``); ``expand``: an input with
its compaction items replaced by what they seal, so that what follows (count,
session, trim, admission) sees a plain conversation and the engine never sees one.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import orjson

from proxy.compaction.fold import fold, is_kept, unfold
from proxy.compaction.seal import CompactionRefused, Sealer
from proxy.dialects.responses import COMPACTION_ITEM, COMPACTION_TRIGGER, COMPACTION_TYPES
from proxy.metrics import Metrics
from proxy.types import JSONObject

_VERSION = 1


def is_item(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") == COMPACTION_ITEM


def is_trigger(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") == COMPACTION_TRIGGER


def as_items(value: Any) -> list[Any]:
    """A Responses ``input`` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"


def make(
    sealer: Sealer,
    metrics: Metrics,
    items: Sequence[Any],
    client_key: str,
    form: str,
    summary: str | None = None,
) -> tuple[list[Any], JSONObject]:
    """The user's messages of ``items`` (already expanded), and the item that seals
    them all. One that would be over the bound leaves out its oldest folded items
    (whole pairs: a call goes with its output)."""
    folded = fold(items)
    while True:
        payload: JSONObject = {"v": _VERSION, "items": folded}
        if summary:
            payload["summary"] = summary
        token = sealer.seal(orjson.dumps(payload), client_key)
        if token is not None or not folded:
            break
        folded = _without_oldest(folded, max(1, len(folded) // 4))
    if token is None:  # a summary alone over the bound: then none
        token = sealer.seal(orjson.dumps({"v": _VERSION, "items": []}), client_key)
        assert token is not None
    metrics.compactions.labels(form).inc()
    item: JSONObject = {"type": COMPACTION_ITEM, "id": new_id("cmp"), "encrypted_content": token}
    return [_as_output(x) for x in items if is_kept(x)], item


def _as_output(message: Any) -> Any:
    """A user message as OpenAI's compaction output writes it: content parts."""
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str):
        return message
    return {**message, "type": "message", "content": [{"type": "input_text", "text": content}]}


def _without_oldest(items: list[Any], n: int) -> list[Any]:
    """``items`` less its first ``n``, and the partners (same ``call_id``) of those."""
    gone = {x.get("call_id") for x in items[:n] if isinstance(x, dict) and x.get("call_id")}
    return [x for x in items[n:] if not (isinstance(x, dict) and x.get("call_id") in gone)]


def expand(sealer: Sealer, metrics: Metrics, items: Sequence[Any], client_key: str) -> list[Any]:
    """``items`` with each compaction item replaced by what it seals (``unfold``)
    and every ``compaction_trigger`` left out; a refused item is the client's 400."""
    out: list[Any] = []
    for item in items:
        if is_trigger(item):
            continue
        if not is_item(item):
            out.append(item)
            continue
        try:
            sealed = orjson.loads(sealer.open(item.get("encrypted_content"), client_key))
        except CompactionRefused:
            metrics.compaction_items.labels("refused").inc()
            raise
        metrics.compaction_items.labels("expanded").inc()
        inner = sealed.get("items") if isinstance(sealed, dict) else None
        sealed_items = inner if isinstance(inner, list) else []
        summary = sealed.get("summary") if isinstance(sealed, dict) else None
        if isinstance(summary, str) and summary:
            sealed_items = [*sealed_items, _summary_message(summary)]
        out = unfold(out, sealed_items)
    return out


def _summary_message(summary: str) -> JSONObject:
    return {
        "type": "message",
        "role": "developer",
        "content": f"Summary of the conversation so far (made at compaction):\n{summary}",
    }


def carries(items: Any) -> bool:
    """Whether an ``input`` holds a compaction item or a trigger."""
    if not isinstance(items, list):
        return False
    # A loop over the types, not any() of two calls an item (49k -> 22k instructions
    # on 19 items; a scan of the body's bytes for the name was 29k; docs/performance.md
    # §5b). The Responses parse answers it on its way (``holds_compaction``).
    types = COMPACTION_TYPES
    for item in items:  # noqa: SIM110 (the loop is the point)
        if isinstance(item, dict) and item.get("type") in types:
            return True
    return False
