"""What trimproxy keeps under a response id (docs/architecture.md §22).

One entry per turn: the input items that turn's request sent itself (not the chain
it continued), the response object as the client got it, and a link to the entry of
the response it continued. A chain is read by walking those links, so storage grows
with what was sent, not with the square of the chain's length; a response whose
ancestor was evicted cannot be continued (the client is told so and sends the whole
conversation again).

On the wire (the memory store's bytes and Redis's value alike) an entry is its
parent's key, a newline, then two JSON lines: the turn (its input, the response's
output items, the chain's session), then the response object with ``output`` null
(put back when it is read whole). A Lua script finds the parent without decoding the
JSON, and a chain's walk decodes only each entry's turn: the rest of a response object
(some 900 bytes of vLLM's fields) was most of a chain's decoding (docs/performance.md
§5b). An entry of the earlier layout (the parent, then one JSON object) is still read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from proxy.types import JSONObject


@dataclass(frozen=True, slots=True)
class Turn:
    """What a chain's walk reads of an entry: its part of the conversation (its input
    items, then its response's output items) and the chain's session."""

    items: list[Any]
    session_key: str | None = None
    session_shown: str | None = None


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
        return _items(self.input, self.response.get("output"))

    def encode(self) -> bytes:
        turn = orjson.dumps(
            {
                "input": self.input,
                "output": self.response.get("output"),
                "session_key": self.session_key,
                "session_shown": self.session_shown,
            }
        )
        rest = orjson.dumps({**self.response, "output": None})  # its place kept
        return b"\n".join(((self.parent or "").encode(), turn, rest))

    @classmethod
    def decode(cls, raw: bytes) -> Stored | None:
        """The entry ``encode`` wrote; None for anything else (a foreign key's value)."""
        parent, sep, body = raw.partition(b"\n")
        if not sep:
            return None
        line, sep, rest = body.partition(b"\n")
        turn = _object(line)
        if turn is None:
            return None
        if sep:  # the turn, then the response without its output
            response = _object(rest)
            if response is None or "output" not in response:
                return None
            response["output"] = turn.get("output")
        else:
            response = turn.get("response")
        items = turn.get("input")
        if not isinstance(response, dict) or not isinstance(items, list):
            return None
        key, shown = _session(turn)
        return cls(response, items, key, shown, parent.decode("ascii", "replace") or None)


def turn_of(raw: bytes) -> Turn | None:
    """The turn of an encoded entry, the rest of its response object left undecoded;
    None where ``Stored.decode`` finds no entry either."""
    _, sep, body = raw.partition(b"\n")
    if not sep:
        return None
    line, sep, _ = body.partition(b"\n")
    if not sep:  # the earlier layout: one object, decoded whole
        stored = Stored.decode(raw)
        if stored is None:
            return None
        return Turn(stored.items(), stored.session_key, stored.session_shown)
    turn = _object(line)
    items = None if turn is None else turn.get("input")
    if turn is None or not isinstance(items, list):
        return None
    return Turn(_items(items, turn.get("output")), *_session(turn))


def _items(items: list[Any], output: Any) -> list[Any]:
    return [*items, *(output if isinstance(output, list) else [])]


def _object(raw: bytes) -> JSONObject | None:
    try:
        value: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _session(value: JSONObject) -> tuple[str | None, str | None]:
    key, shown = value.get("session_key"), value.get("session_shown")
    return (key if isinstance(key, str) else None, shown if isinstance(shown, str) else None)


def parent_of(raw: bytes) -> str | None:
    """The parent key of an encoded entry, without decoding its JSON."""
    parent = raw.partition(b"\n")[0]
    return parent.decode("ascii", "replace") or None
