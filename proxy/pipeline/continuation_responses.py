"""The Responses dialect's continuation form (docs/architecture.md §23).

A streamed ``POST /v1/responses`` answer of one output message goes on on the next
engine as chat's does (``proxy.pipeline.continuation``), in this dialect's shapes:

- ``ResponsesPartial`` reads what the client was sent: the response's head (``id``,
  ``created_at``, ``model``, ``max_output_tokens``), the message item's id, the text of
  its ``response.output_text.delta`` events (one per decode step, as vLLM streams
  them), the last ``sequence_number``, and the opening events the client had. Any
  other item (a function call, reasoning), a second output or content part, logprobs,
  or the answer's own closing events make it not continuable.
- ``continued_responses_body``: the request again, the text so far as a final
  assistant ``message`` item with ``status: "incomplete"`` (vLLM 0.32 continues such an
  item: ``should_continue_final_message`` sets ``continue_final_message`` and drops the
  generation prompt), ``max_output_tokens`` less the tokens generated.
- ``ResponsesReframe``: the new engine's events as the same answer: the first answer's
  head and item id, ``sequence_number`` going on from the last one sent, no second
  ``response.created``/``in_progress``/``output_item.added``/``content_part.added``, and
  the closing events (``output_text.done``, ``content_part.done``,
  ``output_item.done``, ``response.completed``) carrying the whole text; usage counts
  the prompt once and both parts' output tokens. The stored response
  (``proxy.pipeline.chain``) is the re-framed one: it is read from the bytes relayed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.pipeline.continuation import Form, Partial, Reframing, events_of

#: The events that open an answer: sent once, by the first engine.
_OPENINGS = frozenset(
    (
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    )
)
_ENDS = frozenset(("response.completed", "response.incomplete", "response.failed"))
_DELTA = "response.output_text.delta"
_HEAD = ("id", "created_at", "model", "max_output_tokens")


@dataclass(slots=True)
class ResponsesPartial(Partial):
    """What a broken Responses stream sent its client (see the module's docstring)."""

    item: str | None = None
    """The output message's id."""
    sequence: int = -1
    """The last ``sequence_number`` sent."""
    opened: set[str] = field(default_factory=set)
    """The opening events the client had."""

    def feed(self, data: bytes) -> None:
        for payload in events_of(data[: data.rfind(b"\n\n") + 2]):
            event = orjson.loads(payload)
            kind = event.get("type")
            number = event.get("sequence_number")
            if isinstance(number, int):
                self.sequence = number
            if kind in _OPENINGS:
                self._open(kind, event)
            elif kind == _DELTA:
                if event.get("logprobs"):
                    self.refused = "logprobs"
                delta = event.get("delta")
                if isinstance(delta, str) and delta:
                    self.pieces.append(delta)
                    self.events += 1
            elif kind in _ENDS:
                self.finished = True
            else:  # a closing event of the answer's own, or another item's delta
                self.refused = f"{kind} sent"

    def _open(self, kind: str, event: dict[str, Any]) -> None:
        self.opened.add(kind)
        response = event.get("response")
        if isinstance(response, dict) and not self.head:
            self.head = {k: response[k] for k in _HEAD if k in response}
        if kind == "response.output_item.added":
            item = event.get("item") or {}
            if event.get("output_index", 0) != 0:
                self.refused = "a second output item"
            elif item.get("type") != "message":
                self.refused = f"a {item.get('type')} item begun"
            else:
                self.item = item.get("id")
        elif kind == "response.content_part.added" and event.get("content_index", 0) != 0:
            self.refused = "a second content part"


def continued_responses_body(body: bytes, part: Partial) -> bytes | None:
    """The request once more, the text so far as the final incomplete assistant item;
    None when its ``max_output_tokens`` is spent. Nothing generated: as it was."""
    text, tokens = part.text, part.tokens
    if not text and not tokens:
        return body
    request = orjson.loads(body)
    given = request.get("input")
    if isinstance(given, str):
        items: list[Any] = [{"type": "message", "role": "user", "content": given}]
    else:
        items = list(given or [])
    last = items[-1] if items else None
    own = _incomplete_text(last)
    if isinstance(last, dict) and own is not None:
        # The client's own prefix, continued: the text goes on in it.
        first, *rest = last["content"]
        items[-1] = {**last, "content": [{**first, "text": own + text}, *rest]}
    else:
        item_id = part.item if isinstance(part, ResponsesPartial) and part.item else "msg_partial"
        items.append(
            {
                "type": "message",
                "role": "assistant",
                "id": item_id,
                "status": "incomplete",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    request["input"] = items
    limit = request.get("max_output_tokens")
    if isinstance(limit, int) and not isinstance(limit, bool):
        if limit - tokens < 1:
            return None
        request["max_output_tokens"] = limit - tokens
    return orjson.dumps(request)


def _incomplete_text(item: Any) -> str | None:
    """The text of a final assistant message the engine continues, else None."""
    if not isinstance(item, dict) or item.get("type", "message") != "message":
        return None
    if item.get("role") != "assistant" or item.get("status") not in ("incomplete", "in_progress"):
        return None
    content = item.get("content")
    first = content[0] if isinstance(content, list) and content else None
    text = first.get("text") if isinstance(first, dict) else None
    return text if isinstance(text, str) else None


class ResponsesReframe(Reframing):
    """The continuation's events as part of the first answer (the module's docstring)."""

    __slots__ = ("_before", "_head", "_item", "_new", "_next", "_opened", "_tokens")

    def __init__(self, part: Partial) -> None:
        super().__init__()
        assert isinstance(part, ResponsesPartial)
        self._head = part.head
        self._item = part.item
        self._before = part.text
        self._tokens = part.tokens
        self._next = part.sequence + 1
        self._opened = part.opened
        self._new: list[str] = []

    @property
    def _text(self) -> str:
        return self._before + "".join(self._new)

    def _event(self, event: bytes) -> bytes:
        payload = b"".join(events_of(event + b"\n\n"))
        if not payload:
            return b""  # a comment or a keep-alive of the new engine
        data = orjson.loads(payload)
        kind = data.get("type")
        if kind in self._opened:
            return b""
        if self._item is not None and "item_id" in data:
            data["item_id"] = self._item
        if kind == _DELTA and isinstance(data.get("delta"), str):
            self._new.append(data["delta"])
        elif kind == "response.output_text.done":
            data["text"] = self._text
        elif isinstance(data.get("part"), dict) and data["part"].get("type") == "output_text":
            data["part"]["text"] = self._text
        elif isinstance(data.get("item"), dict):
            self._message(data["item"])
        elif isinstance(data.get("response"), dict):
            self._response(data["response"])
        if "sequence_number" in data:
            data["sequence_number"] = self._next
            self._next += 1
        return b"event: " + str(kind).encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def _message(self, item: dict[str, Any]) -> None:
        if item.get("type") != "message":
            return
        if self._item is not None:
            item["id"] = self._item
        content = item.get("content")
        if isinstance(content, list) and content and isinstance(content[0], dict):
            content[0]["text"] = self._text
        elif self._text:
            item["content"] = [
                {"type": "output_text", "text": self._text, "annotations": [], "logprobs": None}
            ]

    def _response(self, response: dict[str, Any]) -> None:
        response.update(self._head)
        output = response.get("output")
        if isinstance(output, list):
            messages = [i for i in output if isinstance(i, dict) and i.get("type") == "message"]
            for item in messages:
                self._message(item)
            if not messages and self._text and self._item is not None:
                item = {"id": self._item, "type": "message", "role": "assistant",
                        "status": "completed", "content": []}  # fmt: skip
                self._message(item)
                output.insert(0, item)
        usage = response.get("usage")
        if isinstance(usage, dict):
            # The new engine's prompt held the first part; its output did not.
            if isinstance(usage.get("input_tokens"), int):
                usage["input_tokens"] = max(0, usage["input_tokens"] - self._tokens)
            if isinstance(usage.get("output_tokens"), int):
                usage["output_tokens"] += self._tokens


#: The Responses dialect's form: a final assistant item with status ``incomplete``.
RESPONSES_FORM = Form(ResponsesPartial, continued_responses_body, ResponsesReframe)
