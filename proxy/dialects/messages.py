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
    object_list,
    rendered,
)
from proxy.dialects.messages_chat import chat_tools, to_chat
from proxy.dialects.messages_checks import BLOCKS, ROLES, check_create, check_messages
from proxy.errors import InvalidRequest
from proxy.types import JSONObject

__all__ = [
    "COMPLETION_FIELD",
    "chat_tools",
    "kinds_of",
    "parse",
    "parse_create",
    "render",
    "to_chat",
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
    system = _system(body)
    head: list[object] = [system] if system else []
    object_list(body, "tools", "tool")
    conv = Conversation(
        endpoint="messages",
        body=body,
        items=[*head, *messages],
        head=len(head),
        model=model,
        stream=stream,
        max_tokens=positive_int(body, COMPLETION_FIELD),
        user=_user(body),
        tools=None,
        kinds_of=kinds_of,
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
    # The roles and block kinds served are noted in the same pass as the shape, and
    # ``check_messages`` (its own pass) runs only when one is not: every body that is
    # served pays one pass, not two (docs/performance.md §6).
    served = True
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(role := message.get("role"), str):
            raise InvalidRequest(
                f"messages[{i}] must be an object with a 'role' string.", param="messages"
            )
        if role not in ROLES:
            served = False
        content = message.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise _bad_content(i)
        for block in content:
            if not isinstance(block, dict):
                raise _bad_content(i)
            if block.get("type") not in BLOCKS:
                served = False
    if not served:
        check_messages(body)  # the first one refused, in its own words
    return value


def _bad_content(i: int) -> InvalidRequest:
    return InvalidRequest(
        f"messages[{i}].content must be a string or a list of content block objects.",
        param="messages",
    )


def _system(body: JSONObject) -> Any:
    system = body.get("system")
    if system is None or isinstance(system, str):
        return system
    if isinstance(system, list) and all(isinstance(b, dict) for b in system):
        return system
    raise InvalidRequest("'system' must be a string or a list of text blocks.", param="system")


def kinds_of(conv: Conversation) -> tuple[list[str], list[tuple[str, ...]]]:
    """Each item's own role and pair keys (``turn_roles``), on the first read of the
    turn roles: the system a system item, a ``tool_use`` and its ``tool_result``
    paired by id, a user message of tool results alone a tool item."""
    messages = conv.items[conv.head :]
    kinds = ["system"] * conv.head + [_kind(m) for m in messages]
    keys: list[tuple[str, ...]] = [()] * conv.head + [tuple(_pair_keys(m)) for m in messages]
    return kinds, keys


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
