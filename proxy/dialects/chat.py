"""The chat-completions dialect: parsing and checking its body, rendering the kept
messages back (docs/architecture.md §4, §22). Its items are the chat messages
themselves, so the chat template renders them as they are.

Only the fields trimming needs are checked; every other field passes through
untouched, unknown ones included. The body stays a plain dict: no pydantic model
on the hot path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.body import answers, common_fields, load_object, positive_int
from proxy.dialects.conversation import Conversation
from proxy.errors import InvalidRequest
from proxy.types import Message


# Not frozen: read-only by convention (why: proxy.types, above PromptCount).
@dataclass(slots=True)
class ChatRequest(Conversation):
    """A chat request: a ``Conversation`` whose items are its messages, each its own
    turn role (trimming reads the messages themselves)."""

    @property
    def messages(self) -> list[Message]:
        return self.items


def _bad_message(messages: list[Any]) -> InvalidRequest:
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return InvalidRequest(f"messages[{i}] must be an object.", param="messages")
        if not isinstance(message.get("role"), str):
            return InvalidRequest(f"messages[{i}] has no 'role' string.", param="messages")
    raise AssertionError("every message has a role string")


def parse_chat(raw: bytes) -> ChatRequest:
    body = load_object(raw, "'model' and 'messages'")
    messages = body.get("messages")
    if messages is None:
        raise InvalidRequest("'messages' is required.", param="messages")
    if not isinstance(messages, list):
        raise InvalidRequest("'messages' must be a list of message objects.", param="messages")
    if not messages:
        raise InvalidRequest("'messages' must hold at least one message.", param="messages")
    holds_tool_role = False
    # Every message, every request: a subscript (a list or a string raises TypeError, a
    # dict without a role KeyError) and a class check (orjson builds plain strs) cost
    # less than isinstance and get(), and leave room to note a tool output for the trim
    # ladder's question (docs/performance.md §6). The error says which message.
    try:
        for message in messages:
            role = message["role"]
            if role.__class__ is not str:
                raise _bad_message(messages)
            if role == "tool":
                holds_tool_role = True
    except (KeyError, TypeError):
        raise _bad_message(messages) from None
    model, stream = common_fields(body)
    tools = body.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise InvalidRequest("'tools' must be a list of tool objects.", param="tools")
    user = body.get("user")
    # max_completion_tokens is the newer name; when both are given it is the one
    # OpenAI and vLLM honour.
    max_tokens = positive_int(body, "max_completion_tokens") or positive_int(body, "max_tokens")
    return ChatRequest(
        endpoint="chat",
        body=body,
        items=messages,
        given_roles=messages,
        holds_tool_role=holds_tool_role,
        head=0,
        model=model,
        max_tokens=max_tokens,
        stream=stream,
        tools=tools or None,
        user=user if isinstance(user, str) and user else None,
        n=answers(body),
    )


def to_chat(conv: Conversation, kept: Sequence[int]) -> tuple[list[Message], list[int]]:
    """The kept messages, each its own item."""
    return [conv.items[i] for i in kept], list(kept)


def render(conv: Conversation, kept: Sequence[int], max_tokens: int | None) -> bytes:
    """The body to forward: the same object with the kept messages (of ``conv.items``),
    and ``max_tokens`` (when given) written to the field the client bounded its answer
    by (``max_completion_tokens``, which vLLM honours first, else ``max_tokens``, the
    one both vLLM and FastChat read)."""
    body = dict(conv.body)
    items = conv.items
    # The kept messages, or every one when they are not the body's own (a copy with
    # some of them changed).
    if len(kept) != len(items) or items is not body.get("messages"):
        body["messages"] = [items[i] for i in kept]
    if max_tokens is not None:
        asked = conv.max_tokens is not None and body.get("max_completion_tokens") is not None
        body["max_completion_tokens" if asked else "max_tokens"] = max_tokens
    return orjson.dumps(body)
