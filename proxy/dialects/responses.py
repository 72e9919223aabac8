"""The OpenAI Responses dialect (``POST /v1/responses``).

Items: ``instructions`` (when a non-empty string) is a synthesized head item; then
the ``input`` items in order (a string ``input`` is one user item). Leading
system/developer message items are head too. A user message opens a turn unless it
stands between a call and its output (paired by ``call_id``: ``function_call``,
``custom_tool_call`` and every other ``*_call``/``*_call_output``; an MCP approval
request and its response by id). Reasoning items and unknown item types stay in the
turn they stand in and pass through untouched.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.body import common_fields, load_object, positive_int
from proxy.dialects.conversation import (
    Conversation,
    count_of,
    json_object,
    rendered,
    turn_roles,
)
from proxy.dialects.responses_chat import chat_tools, to_chat
from proxy.errors import InvalidRequest
from proxy.types import JSONObject

__all__ = [
    "COMPLETION_FIELD",
    "continues_final",
    "parse",
    "render",
    "stream_usage",
    "to_chat",
    "usage_of",
    "with_input",
]

COMPLETION_FIELD = "max_output_tokens"

#: The streamed events that close a response and carry its ``usage``.
_FINAL_EVENTS = frozenset(("response.completed", "response.incomplete", "response.failed"))


def parse(raw: bytes) -> Conversation:
    return _build(load_object(raw, "'model' and 'input'"))


def with_input(conv: Conversation, items: list[JSONObject]) -> Conversation:
    """The same request with ``items`` as its whole input (a stored chain expanded in
    front of the client's own items), every derived field built again."""
    body = dict(conv.body)
    body["input"] = items
    return _build(body)


def _build(body: JSONObject) -> Conversation:
    model, stream = common_fields(body)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequest(
            "'instructions' must be a string or null; put system content in it as text.",
            param="instructions",
        )
    head: list[object] = [instructions] if instructions else []
    entries = _input(body)
    items = [*head, *entries]
    kinds = ["system"] * len(head) + [_kind(item) for item in entries]
    keys = [()] * len(head) + [_pair_keys(item) for item in entries]
    return Conversation(
        endpoint="responses",
        body=body,
        items=items,
        roles=turn_roles(kinds, keys),
        head=len(head),
        model=model,
        stream=stream,
        max_tokens=positive_int(body, COMPLETION_FIELD),
        user=_user(body),
        tools=chat_tools(body.get("tools")),
    )


def _input(body: JSONObject) -> list[object]:
    if "input" not in body or body["input"] is None:
        raise InvalidRequest(
            "'input' is required: a string or a list of input items.", param="input"
        )
    value = body["input"]
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise InvalidRequest("'input' must be a string or a list of input items.", param="input")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise InvalidRequest(f"input[{i}] must be an object.", param="input")
        if item.get("type", "message") == "message" and not isinstance(item.get("role"), str):
            raise InvalidRequest(
                f"input[{i}] is a message without a 'role' string; give it 'role' "
                "(user, assistant, system or developer).",
                param="input",
            )
    return list(value)


def session_roles(conv: Conversation) -> list[str]:
    """The role each item counts as for the session limit (docs/sessions.md): every
    user message is a turn, one wrapped between a call and its output included, and
    so is every system/developer input message but the first, so a dummy call or a
    relabelled role cannot hide turns from TRIMPROXY_SESSION_MAX_TURNS. Trimming keeps
    its own view (``conv.roles``)."""
    out: list[str] = []
    instructed = False
    for i, (role, item) in enumerate(zip(conv.roles, conv.items, strict=True)):
        kind = "instructions" if i < conv.head else _kind(item)
        if kind in ("system", "developer") and not instructed:
            instructed = True
            out.append(role["role"])
        elif kind in ("user", "system", "developer"):
            out.append("user")
        else:
            out.append(role["role"])
    return out


def _kind(item: object) -> str:
    """The role an input item has on its own (``turn_roles`` decides the rest)."""
    if isinstance(item, str):
        return "user"
    assert isinstance(item, dict)
    kind = item.get("type")
    role = item.get("role")
    if (kind is None or kind == "message") and isinstance(role, str):
        return role
    if isinstance(kind, str) and kind.endswith("_output"):
        return "tool"
    return "assistant"


def _pair_keys(item: object) -> tuple[str, ...]:
    if not isinstance(item, dict):
        return ()
    kind = item.get("type")
    if kind == "mcp_approval_request":
        key = item.get("id")
    elif kind == "mcp_approval_response":
        key = item.get("approval_request_id")
    else:
        key = item.get("call_id")
    return (key,) if isinstance(key, str) else ()


def _user(body: JSONObject) -> str | None:
    # ``user`` is deprecated in favour of ``safety_identifier``; either one names the
    # end user the same way.
    for name in ("user", "safety_identifier"):
        value = body.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def continues_final(conv: Conversation, kept: Sequence[int]) -> bool:
    """Whether vLLM continues the last kept item instead of opening a new answer (no
    generation prompt): a message or reasoning item left ``in_progress`` or
    ``incomplete`` (``should_continue_final_message``)."""
    last = conv.items[kept[-1]] if kept and kept[-1] >= conv.head else None
    if not isinstance(last, dict) or last.get("type", "message") not in ("message", "reasoning"):
        return False
    return last.get("status") in ("in_progress", "incomplete")


def render(
    conv: Conversation,
    kept: Sequence[int],
    max_tokens: int | None,
    *,
    store: bool | None = None,
) -> bytes:
    """The body to forward: ``input`` holds the kept items (the client's own objects;
    a string input stays as it came), ``instructions`` and every other field untouched,
    ``max_tokens`` written to ``max_output_tokens`` and ``store`` forced when given."""
    updates: dict[str, object] = {}
    if max_tokens is not None:
        updates[COMPLETION_FIELD] = max_tokens
    if store is not None:
        updates["store"] = store
    if isinstance(conv.body.get("input"), str):
        updates["input"] = conv.body["input"]
    return rendered(conv, "input", kept, updates)


def usage_of(body: bytes) -> tuple[int | None, int | None]:
    """(input tokens, output tokens) of a JSON response object."""
    answer = json_object(body)
    return _usage(answer.get("usage") if answer is not None else None)


def stream_usage(event_data: bytes) -> tuple[int | None, int | None] | None:
    """The usage an SSE event's JSON carries: the final event's response has it
    (``response.completed``, or ``incomplete``/``failed``); None for every other."""
    event = json_object(event_data)
    if event is None or event.get("type") not in _FINAL_EVENTS:
        return None
    response = event.get("response")
    return _usage(response.get("usage") if isinstance(response, dict) else None)


def _usage(usage: object) -> tuple[int | None, int | None]:
    if not isinstance(usage, dict):
        return None, None
    return count_of(usage.get("input_tokens")), count_of(usage.get("output_tokens"))
