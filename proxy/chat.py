"""Parsing and checking a chat-completions request body.

Only the fields trimming needs are checked; every other field passes through
untouched, unknown ones included. The body stays a plain dict: no pydantic model
on the hot path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from proxy.errors import InvalidRequest
from proxy.types import JSONObject, Message


# Not frozen: read-only by convention (why: proxy.types, above PromptCount).
@dataclass(slots=True)
class ChatRequest:
    body: JSONObject
    messages: list[Message]
    model: str | None
    max_tokens: int | None
    stream: bool
    tools: list[JSONObject] | None
    user: str | None
    n: int = 1
    """Answers asked for; each holds its own completion in the engine's KV cache."""


def _optional_int(body: JSONObject, name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequest(f"'{name}' must be a positive integer or null.", param=name)
    return value


def _answers(body: JSONObject) -> int:
    """How many answers ``n`` asks for, for the KV reservation. A value that is not a
    positive integer is the engine's to refuse, in its own words (its error body is
    relayed as it is): it counts as one here."""
    value = body.get("n")
    if isinstance(value, int) and not isinstance(value, bool) and value > 1:
        return value
    return 1


#: Deeper than orjson writes (it reads 1024 levels, writes fewer than 255): a body
#: that could not be re-serialised after trimming, or hashed for a session, is
#: refused up front, so no later step can fail on it with a 500.
MAX_NESTING = 250


def _check_nesting(body: JSONObject) -> None:
    # Serialising is the check itself, and cheaper than any pre-filter: orjson writes
    # a body in less time than counting its brackets (two C scans of the raw bytes)
    # takes (docs/performance.md §6).
    try:
        orjson.dumps(body)
    except orjson.JSONEncodeError:
        raise _too_deep() from None


def _too_deep() -> InvalidRequest:
    return InvalidRequest(
        f"The request body is nested more than {MAX_NESTING} levels deep; this proxy "
        "does not accept JSON that deep. Flatten the structure.",
        param=None,
    )


def _bad_message(messages: list[Any]) -> InvalidRequest:
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return InvalidRequest(f"messages[{i}] must be an object.", param="messages")
        if not isinstance(message.get("role"), str):
            return InvalidRequest(f"messages[{i}] has no 'role' string.", param="messages")
    raise AssertionError("every message has a role string")


def parse_chat(raw: bytes) -> ChatRequest:
    try:
        body: Any = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        # orjson reads 1024 levels and stops there with a decode error: deeper JSON is
        # valid, and answered as too deep, like any body past MAX_NESTING.
        if exc.msg.startswith("depth limit exceeded"):
            raise _too_deep() from None
        raise InvalidRequest(
            f"The request body is not valid JSON (error at byte {exc.pos}). "
            "Send a JSON object with 'model' and 'messages'.",
            param=None,
        ) from exc
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", param=None)
    _check_nesting(body)
    messages = body.get("messages")
    if messages is None:
        raise InvalidRequest("'messages' is required.", param="messages")
    if not isinstance(messages, list):
        raise InvalidRequest("'messages' must be a list of message objects.", param="messages")
    if not messages:
        raise InvalidRequest("'messages' must hold at least one message.", param="messages")
    for message in messages:
        # orjson builds plain dicts and strs, so a class check is the isinstance one,
        # at two thirds of the cost on every message; the error says which one.
        if message.__class__ is not dict or message.get("role").__class__ is not str:
            raise _bad_message(messages)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest("'model' must be a string.", param="model")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be true or false.", param="stream")
    tools = body.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise InvalidRequest("'tools' must be a list of tool objects.", param="tools")
    user = body.get("user")
    # max_completion_tokens is the newer name; when both are given it is the one
    # OpenAI and vLLM honour.
    max_tokens = _optional_int(body, "max_completion_tokens") or _optional_int(body, "max_tokens")
    return ChatRequest(
        body=body,
        messages=messages,
        model=model,
        max_tokens=max_tokens,
        stream=bool(stream),
        tools=tools or None,
        user=user if isinstance(user, str) and user else None,
        n=_answers(body),
    )


def with_messages(request: ChatRequest, messages: list[Message]) -> bytes:
    """The body to forward after trimming: the same object, fewer messages."""
    body = dict(request.body)
    body["messages"] = messages
    return orjson.dumps(body)
