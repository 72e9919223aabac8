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
from typing import Any

from proxy.body import common_fields, load_object, positive_int
from proxy.dialects.conversation import Conversation, rendered
from proxy.dialects.responses_chat import chat_tools, to_chat
from proxy.errors import InvalidRequest
from proxy.types import JSONObject

__all__ = [
    "COMPACTION_ITEM",
    "COMPACTION_TRIGGER",
    "COMPACTION_TYPES",
    "COMPLETION_FIELD",
    "kinds_of",
    "parse",
    "render",
    "to_chat",
    "with_input",
]

COMPLETION_FIELD = "max_output_tokens"
#: The input item types of compaction (``proxy.compaction``): a compacted item, and
#: the trigger that asks for one.
COMPACTION_ITEM = "compaction"
COMPACTION_TRIGGER = "compaction_trigger"
COMPACTION_TYPES = (COMPACTION_ITEM, COMPACTION_TRIGGER)


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
    entries, plain, compacts = _input(body)
    items = [*head, *entries]
    view = None
    if plain:  # the chat view is the items, the instructions a system message
        view = [{"role": "system", "content": instructions}, *entries] if head else items
    return Conversation(
        endpoint="responses",
        body=body,
        items=items,
        plain_view=view,
        plain_for=items if plain else None,
        head=len(head),
        model=model,
        stream=stream,
        max_tokens=positive_int(body, COMPLETION_FIELD),
        user=_user(body),
        tools=chat_tools(body.get("tools")),
        kinds_of=kinds_of,
        holds_compaction=compacts,
    )


def _input(body: JSONObject) -> tuple[list[Any], bool, bool]:
    """The input items, each checked; whether each is a chat message as it stands
    (``to_chat`` would give it back), and whether one is a compaction item or trigger:
    one pass, as every request pays it (docs/performance.md §5b). The items' kinds and
    pair keys wait for the first read of the turn roles (``kinds_of``)."""
    if "input" not in body or body["input"] is None:
        raise InvalidRequest(
            "'input' is required: a string or a list of input items.", param="input"
        )
    value = body["input"]
    if isinstance(value, str):
        return [value], False, False
    if not isinstance(value, list):
        raise InvalidRequest("'input' must be a string or a list of input items.", param="input")
    plain = True  # every item a chat message as it stands, so far
    compacts = False
    before = None
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise InvalidRequest(f"input[{i}] must be an object.", param="input")
        kind = item.get("type")
        if kind is None or kind == "message":
            role = item.get("role")
            if isinstance(role, str):
                if plain and role == "assistant":
                    # The chat view makes an assistant's text a bare message of its own,
                    # or merges it into the assistant's before (``to_chat``).
                    plain = (
                        before != "assistant"
                        and len(item) == 2
                        and item.get("content").__class__ is str
                    )
                before = role
            elif kind is None and "type" in item:  # an explicit null type asks no role
                plain = False
            else:
                raise InvalidRequest(
                    f"input[{i}] is a message without a 'role' string; give it 'role' "
                    "(user, assistant, system or developer).",
                    param="input",
                )
        else:
            plain = False
            if kind in COMPACTION_TYPES:
                compacts = True
    # The body's own list: ``_build`` copies it once, behind the instructions.
    return value, plain, compacts


def kinds_of(conv: Conversation) -> tuple[list[str], list[tuple[str, ...]]]:
    """Each item's own role and pair keys (``turn_roles``): the instructions a system
    item, a call and its output paired by ``call_id``, an MCP approval request and its
    response by the request's id."""
    kinds = ["system"] * conv.head
    keys: list[tuple[str, ...]] = [()] * conv.head
    for item in conv.items[conv.head :]:
        kinds.append(_kind(item))
        if not isinstance(item, dict):
            keys.append(())
            continue
        kind = item.get("type")
        if kind == "mcp_approval_request":
            key = item.get("id")
        elif kind == "mcp_approval_response":
            key = item.get("approval_request_id")
        else:
            key = item.get("call_id")
        keys.append((key,) if isinstance(key, str) else ())
    return kinds, keys


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


def _user(body: JSONObject) -> str | None:
    # ``user`` is deprecated in favour of ``safety_identifier``; either one names the
    # end user the same way.
    for name in ("user", "safety_identifier"):
        value = body.get(name)
        if isinstance(value, str) and value:
            return value
    return None


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
