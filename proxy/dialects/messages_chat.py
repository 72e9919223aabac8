"""Messages as the chat messages vLLM renders for them, for counting.

The same conversion as vLLM 0.32's ``AnthropicServingMessages.to_chat_completion_request``
(vllm/entrypoints/anthropic/serving.py: ``_convert_system_message``,
``_convert_messages``, ``_convert_block``, ``_convert_user_tool_result``,
``_resolve_tools``, ``_convert_tools``), written from reading it:

- ``system``: its text (the text blocks joined with nothing between them, Claude
  Code's ``x-anthropic-billing-header`` block left out) as one system message;
- a user message's ``tool_result`` blocks become tool messages placed before what is
  left of it (an image in a result becomes a user message after its tool message);
  a user message left with no content yields nothing more;
- text blocks become the content (one text block: a string; more, or images: a list
  of parts), ``thinking`` blocks the ``reasoning``, ``tool_use`` blocks ``tool_calls``
  (arguments written by Python's ``json.dumps``); a ``tool_result`` in an assistant
  message becomes the text ``Tool result: ...``;
- a ``system`` message inside the list (a vLLM extension) becomes a system message
  in place, or, for a chat template that wants one leading system message
  (``merge_inline_system``), joins the leading one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from proxy.dialects.conversation import Conversation
from proxy.types import JSONObject, Message

_BILLING = "x-anthropic-billing-header"
#: vLLM names a ``tool_use`` without an id ``call_<unix time>``: a fixed time of the
#: same length here, so that one conversation always converts the same way.
_MISSING_ID = "call_1700000000"


def to_chat(
    conv: Conversation, kept: Sequence[int], *, merge_inline_system: bool = False
) -> tuple[list[Message], list[int]]:
    """The chat messages vLLM builds from the kept items, and each one's item index.

    With ``merge_inline_system`` the one system message holds the head's text and every
    kept inline system message's; it is owned by the first item that gave it text.
    """
    messages: list[Message] = []
    owner: list[int] = []
    items = conv.items
    parts: list[str] = []
    first: int | None = None
    for i in kept:
        text = _head_text(items[i]) if i < conv.head else None
        if i >= conv.head and merge_inline_system and items[i].get("role") == "system":
            text = _blocks_text(items[i].get("content"))
        if text:
            parts.append(text)
            first = i if first is None else first
    if first is not None:
        messages.append({"role": "system", "content": "".join(parts)})
        owner.append(first)
    for i in kept:
        if i < conv.head:
            continue
        made = _message(items[i], merge_inline_system)
        messages.extend(made)
        owner.extend([i] * len(made))
    return messages, owner


def _head_text(system: Any) -> str | None:
    # The top-level string is taken whole; only blocks are checked for the header.
    return system if isinstance(system, str) else _blocks_text(system)


def _blocks_text(content: Any) -> str | None:
    """A system prompt's text: a string as it is, text blocks joined; the billing
    header (a per-request hash that would defeat the prefix cache) left out."""
    if isinstance(content, str):
        return None if content.startswith(_BILLING) else content
    if not isinstance(content, list):
        return None
    texts = [
        block["text"]
        for block in content
        if isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
        and block["text"]
        and not block["text"].startswith(_BILLING)
    ]
    return "".join(texts) if texts else None


def _message(message: JSONObject, merge_inline_system: bool) -> list[Message]:
    role = message.get("role")
    content = message.get("content")
    if role == "system":
        text = None if merge_inline_system else _blocks_text(content)
        return [{"role": "system", "content": text}] if text else []
    out: list[Message] = []
    converted: Message = {"role": role}
    if isinstance(content, str):
        converted["content"] = content
    elif isinstance(content, list):
        _convert_blocks(content, role, converted, out)
    if not (role == "user" and "content" not in converted):
        out.append(converted)
    return out


def _convert_blocks(blocks: list[Any], role: Any, converted: Message, out: list[Message]) -> None:
    parts: list[JSONObject] = []
    calls: list[JSONObject] = []
    reasoning: list[str] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and block.get("source"):
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block["source"])}})
        elif kind == "thinking" and block.get("thinking") is not None:
            reasoning.append(block["thinking"])
        elif kind == "tool_use":
            calls.append(_tool_call(block))
        elif kind == "tool_result" and role == "user":
            out.extend(_tool_result(block))
        elif kind == "tool_result":
            result = block.get("content")
            parts.append({"type": "text", "text": f"Tool result: {str(result) if result else ''}"})
    if reasoning:
        converted["reasoning"] = "".join(reasoning)
    if calls:
        converted["tool_calls"] = calls
    if len(parts) == 1 and parts[0]["type"] == "text":
        converted["content"] = parts[0]["text"]
    elif parts:
        converted["content"] = parts


def _tool_call(block: JSONObject) -> JSONObject:
    # Python's own json.dumps, as vLLM writes it: ", " and ": ", ASCII escapes.
    arguments = json.dumps(block.get("input") or {})
    return {
        "id": block.get("id") or _MISSING_ID,
        "type": "function",
        "function": {"name": block.get("name") or "", "arguments": arguments},
    }


def _image_url(source: Any) -> str:
    if not isinstance(source, dict):
        source = {}
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _tool_result(block: JSONObject) -> list[Message]:
    content = block.get("content")
    call_id = block.get("tool_use_id") or ""
    text = content if isinstance(content, str) else ""
    images: list[str] = []
    references: list[JSONObject] = []
    if isinstance(content, list):
        texts: list[str] = []
        for item in content:
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "text":
                texts.append(item.get("text", ""))
            elif kind == "image":
                url = _image_url(item.get("source", {}))
                if url:
                    images.append(url)
            elif kind == "tool_reference":
                name = item.get("tool_name") or item.get("name")
                if name:
                    references.append({"type": "tool_reference", "name": name})
        text = "\n".join(texts)
    out: list[Message] = [{"role": "tool", "tool_call_id": call_id, "content": text or ""}]
    if images:
        parts = [{"type": "image_url", "image_url": {"url": url}} for url in images]
        out.append({"role": "user", "content": parts})
    if references:
        out.append({"role": "tool", "tool_call_id": call_id, "content": references})
    return out


def chat_tools(conv: Conversation, kept: Iterable[int]) -> list[JSONObject] | None:
    """The tools vLLM hands to the chat template for the kept items: the request's
    ``tools`` with the ``tool_addition``/``tool_removal`` blocks of the kept system
    messages applied in order, in the chat form."""
    declared = conv.body.get("tools")
    tools: dict[Any, JSONObject] = {}
    for tool in declared if isinstance(declared, list) else ():
        if isinstance(tool, dict):
            tools[tool.get("name")] = tool
    removed: set[Any] = set()
    changed = False
    for block in _tool_changes(conv, kept):
        changed = True
        change = block.get("tool")
        change = change if isinstance(change, dict) else {}
        definition = change.get("definition")
        if change.get("type") == "tool_definition" and isinstance(definition, dict):
            name = definition.get("name")
            tools[name] = definition
        else:
            name = change.get("name")
            if name not in tools:
                continue  # vLLM refuses the request: the engine says so
            if block.get("type") == "tool_addition":
                tools[name] = {**tools[name], "defer_loading": None}
        if block.get("type") == "tool_removal":
            removed.add(name)
        else:
            removed.discard(name)
    if not changed:
        return None if not isinstance(declared, list) else [_function(t) for t in declared]
    return [_function(tool) for name, tool in tools.items() if name not in removed]


def _tool_changes(conv: Conversation, kept: Iterable[int]) -> Iterable[JSONObject]:
    for i in kept:
        message = conv.items[i]
        if i < conv.head or message.get("role") != "system":
            continue  # vLLM accepts tool changes in system messages only
        content = message.get("content")
        for block in content if isinstance(content, list) else ():
            if block.get("type") in ("tool_addition", "tool_removal"):
                yield block


def _function(tool: JSONObject) -> JSONObject:
    schema = tool.get("input_schema")
    schema = dict(schema) if isinstance(schema, dict) else {}
    schema.setdefault("type", "object")  # vLLM's default, added last
    function: JSONObject = {
        "name": tool.get("name"),
        "description": tool.get("description"),
        "parameters": schema,
    }
    for optional in ("strict", "defer_loading"):
        if tool.get(optional) is not None:
            function[optional] = tool[optional]
    return {"type": "function", "function": function}
