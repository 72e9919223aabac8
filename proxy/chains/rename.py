"""The answer under the id trimproxy minted (docs/architecture.md §22).

A stored response's id is minted by the proxy and sent to the engine as the body's
``request_id``, which vLLM answers as the response id. An engine that answers
another id (an older vLLM, the simulator) has it rewritten to the minted one in the
answer the client gets, so the id a client continues or retrieves is always the one
stored. A rewritten JSON body changes length: its ``Content-Length`` is set again.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.types import JSONObject


def rename_json(body: bytes, rid: str) -> tuple[bytes, JSONObject | None]:
    """The JSON answer under ``rid`` and its response object; unchanged (and None)
    when it is not a response object."""
    try:
        value: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body, None
    if not isinstance(value, dict) or not isinstance(value.get("id"), str):
        return body, None
    if value["id"] == rid:
        return body, value
    value["id"] = rid
    return orjson.dumps(value), value


class SseRename:
    """A stream's events under ``rid``: the engine's id, learnt from the first event
    that carries a response object, is replaced in every whole event. Bytes after the
    last whole event wait for the next chunk (an event ends with a blank line)."""

    def __init__(self, rid: str) -> None:
        self.rid = rid.encode()
        self._engine: bytes | None = None
        self._tail = b""

    def feed(self, chunk: bytes, more: bool) -> bytes:
        buf = self._tail + chunk if self._tail else chunk
        if not more:
            self._tail = b""
            return self._rename(buf)
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._tail = buf
            return b""
        self._tail = buf[end + 2 :]
        return self._rename(buf[: end + 2])

    def _rename(self, block: bytes) -> bytes:
        if self._engine is None:
            self._engine = _engine_id(block)
        if self._engine is None or self._engine == self.rid:
            return block
        return block.replace(b'"' + self._engine + b'"', b'"' + self.rid + b'"')


def _engine_id(block: bytes) -> bytes | None:
    for event in block.split(b"\n\n"):
        for line in event.split(b"\n"):
            if not line.startswith(b"data:") or b'"response"' not in line:
                continue
            try:
                value: Any = orjson.loads(line[5:])
            except orjson.JSONDecodeError:
                continue
            found = value.get("response") if isinstance(value, dict) else None
            rid = found.get("id") if isinstance(found, dict) else None
            if isinstance(rid, str) and rid:
                return rid.encode()
    return None
