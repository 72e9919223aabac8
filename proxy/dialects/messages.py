"""The Anthropic Messages dialect (``POST /v1/messages``).

Items: ``system`` (when present and not empty) is a synthesized head item; then the
``messages`` in order. A user message opens a turn unless it holds only
``tool_result`` blocks, or stands inside a ``tool_use``/``tool_result`` pair (paired
by id): either one belongs to the turn before it. So whole turns dropped from the
front leave a list that starts with a user message and, when the client's list
alternated, still alternates. vLLM also accepts ``system`` messages inside the list:
leading ones are head, later ones stay in their turn.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from proxy.body import common_fields, load_object, positive_int
from proxy.dialects.conversation import (
    Conversation,
    count_of,
    json_object,
    object_list,
    rendered,
    turn_roles,
)
from proxy.dialects.messages_chat import chat_tools, to_chat
from proxy.dialects.messages_checks import check_create, check_messages
from proxy.errors import InvalidRequest
from proxy.types import JSONObject

__all__ = [
    "COMPLETION_FIELD",
    "chat_tools",
    "parse",
    "parse_create",
    "render",
    "stream_usage",
    "to_chat",
    "usage_of",
]

COMPLETION_FIELD = "max_tokens"
_NEEDS = "'model', 'max_tokens' and 'messages'"


def parse_create(raw: bytes) -> Conversation:
    """``POST /v1/messages``: ``parse`` with ``model`` and ``max_tokens`` required."""
    conv = parse(raw)
    check_create(conv.body)
    return conv


def parse(raw: bytes) -> Conversation:
    body = load_object(raw, _NEEDS)
    model, stream = common_fields(body)
    messages = _messages(body)
    check_messages(body)
    system = _system(body)
    head: list[object] = [system] if system else []
    object_list(body, "tools", "tool")
    conv = Conversation(
        endpoint="messages",
        body=body,
        items=[*head, *messages],
        roles=turn_roles(
            ["system"] * len(head) + [_kind(m) for m in messages],
            [()] * len(head) + [tuple(_pair_keys(m)) for m in messages],
        ),
        head=len(head),
        model=model,
        stream=stream,
        max_tokens=positive_int(body, COMPLETION_FIELD),
        user=_user(body),
        tools=None,
    )
    conv.tools = chat_tools(conv, range(len(conv.items)))
    return conv


def _messages(body: JSONObject) -> list[JSONObject]:
    value = body.get("messages")
    if not isinstance(value, list) or not value:
        raise InvalidRequest(
            "'messages' must be a non-empty list of message objects, each with 'role' "
            "(user or assistant) and 'content'.",
            param="messages",
        )
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidRequest(
                f"messages[{i}] must be an object with a 'role' string.", param="messages"
            )
        content = message.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
            raise InvalidRequest(
                f"messages[{i}].content must be a string or a list of content block objects.",
                param="messages",
            )
    return value


def _system(body: JSONObject) -> Any:
    system = body.get("system")
    if system is None or isinstance(system, str):
        return system
    if isinstance(system, list) and all(isinstance(b, dict) for b in system):
        return system
    raise InvalidRequest("'system' must be a string or a list of text blocks.", param="system")


def _kind(message: JSONObject) -> str:
    role: str = message["role"]
    if role == "user" and _only_tool_results(message.get("content")):
        return "tool"
    return role if role in ("user", "system") else "assistant"


def _only_tool_results(content: Any) -> bool:
    return (
        isinstance(content, list)
        and bool(content)
        and all(block.get("type") == "tool_result" for block in content)
    )


def _pair_keys(message: JSONObject) -> Iterator[str]:
    content = message.get("content")
    if not isinstance(content, list):
        return
    for block in content:
        kind = block.get("type")
        key = block.get("id") if kind == "tool_use" else None
        if kind == "tool_result":
            key = block.get("tool_use_id")
        if isinstance(key, str):
            yield key


def _user(body: JSONObject) -> str | None:
    metadata = body.get("metadata")
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    return user if isinstance(user, str) and user else None


def render(conv: Conversation, kept: Sequence[int], max_tokens: int | None) -> bytes:
    """The body to forward: ``messages`` holds the kept messages (the client's own
    objects), ``system`` and every other field untouched, ``max_tokens`` written when
    given."""
    updates = {} if max_tokens is None else {COMPLETION_FIELD: max_tokens}
    return rendered(conv, "messages", kept, updates)


def usage_of(body: bytes) -> tuple[int | None, int | None]:
    """(input tokens, output tokens) of a JSON message. Anthropic's ``input_tokens``
    leaves out the cached part, so the prompt is its sum with the two cache counts."""
    answer = json_object(body)
    return _usage(answer.get("usage") if answer is not None else None)


def stream_usage(event_data: bytes) -> tuple[int | None, int | None] | None:
    """The usage an SSE event's JSON carries: ``message_start`` the input tokens (its
    output count is a placeholder), ``message_delta`` the output tokens (and the input
    tokens too where the server repeats them, as vLLM does); None for every other."""
    event = json_object(event_data)
    kind = event.get("type") if event is not None else None
    if event is None or kind not in ("message_start", "message_delta"):
        return None
    if kind == "message_start":
        message = event.get("message")
        usage = message.get("usage") if isinstance(message, dict) else None
        return _usage(usage)[0], None
    usage = event.get("usage")
    prompt, output = _usage(usage)
    return (prompt if isinstance(usage, dict) and "input_tokens" in usage else None), output


def _usage(usage: object) -> tuple[int | None, int | None]:
    if not isinstance(usage, dict):
        return None, None
    prompt = count_of(usage.get("input_tokens"))
    if prompt is not None:
        for cached in ("cache_read_input_tokens", "cache_creation_input_tokens"):
            prompt += count_of(usage.get(cached)) or 0
    return prompt, count_of(usage.get("output_tokens"))
