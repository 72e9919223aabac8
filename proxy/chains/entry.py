"""What trimproxy keeps under a response id (docs/architecture.md §22).

A stored response holds its whole conversation: the input items of the request that
made it, after its ``previous_response_id`` was expanded and before trimming (the
conversation, not the view the engine was sent), and the response object as the
client got it. The next request of the chain is then one lookup, whatever the chain's
length, and a response stays usable when the ones before it were evicted.
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
    """The request's input items, its chain expanded, before trimming."""
    session_key: str | None = None
    """The chain's session (its first request's), carried by every response of it."""
    session_shown: str | None = None

    def items(self) -> list[Any]:
        """The conversation a request continuing this response starts with: these
        input items, then the response's output items."""
        output = self.response.get("output")
        return [*self.input, *(output if isinstance(output, list) else [])]

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "response": self.response,
                "input": self.input,
                "session_key": self.session_key,
                "session_shown": self.session_shown,
            }
        )

    @classmethod
    def decode(cls, raw: bytes) -> Stored | None:
        """The entry ``encode`` wrote; None for anything else (a foreign key's value)."""
        try:
            value: Any = orjson.loads(raw)
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
        )
