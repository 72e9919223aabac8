"""What trimproxy keeps under a response id (docs/architecture.md §22).

One entry per turn: the input items that turn's request sent itself (not the chain
it continued), the response object as the client got it, and a link to the entry of
the response it continued. A chain is read by walking those links, so storage grows
with what was sent, not with the square of the chain's length; a response whose
ancestor was evicted cannot be continued (the client is told so and sends the whole
conversation again).

On the wire (the memory store's bytes and Redis's value alike) an entry is its
parent's key, a newline, then the JSON: a Lua script finds the parent without
decoding the JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from proxy.types import JSONObject


@dataclass(frozen=True, slots=True)
class Stored:
    response: JSONObject
    """The response object as the client got it (``GET /v1/responses/{id}``)."""
    input: list[Any]
    """This turn's own input items, before trimming (not the chain before it)."""
    session_key: str | None = None
    """The chain's session (its first request's), carried by every response of it."""
    session_shown: str | None = None
    parent: str | None = None
    """The store key of the response this one continued; None for a chain's first."""

    def items(self) -> list[Any]:
        """This turn's part of the conversation: its input items, then the response's
        output items."""
        output = self.response.get("output")
        return [*self.input, *(output if isinstance(output, list) else [])]

    def encode(self) -> bytes:
        body = orjson.dumps(
            {
                "response": self.response,
                "input": self.input,
                "session_key": self.session_key,
                "session_shown": self.session_shown,
            }
        )
        return (self.parent or "").encode() + b"\n" + body

    @classmethod
    def decode(cls, raw: bytes) -> Stored | None:
        """The entry ``encode`` wrote; None for anything else (a foreign key's value)."""
        parent, sep, body = raw.partition(b"\n")
        if not sep:
            return None
        try:
            value: Any = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(value, dict):
            return None
        response, items = value.get("response"), value.get("input")
        if not isinstance(response, dict) or not isinstance(items, list):
            return None
        key, shown = value.get("session_key"), value.get("session_shown")
        return cls(
            response,
            items,
            key if isinstance(key, str) else None,
            shown if isinstance(shown, str) else None,
            parent.decode("ascii", "replace") or None,
        )


def parent_of(raw: bytes) -> str | None:
    """The parent key of an encoded entry, without decoding its JSON."""
    parent = raw.partition(b"\n")[0]
    return parent.decode("ascii", "replace") or None
