"""An Anthropic Messages request as the chat request vLLM 0.32 turns it into
(``anthropic/serving.py``: ``AnthropicServingMessages.to_chat_completion_request``),
so the sim counts, refuses and answers it as its chat route would.

* ``system`` (a string, or text blocks joined with nothing between them, Claude
  Code's ``x-anthropic-billing-header`` block left out): one system message first.
  A ``system`` message inside ``messages`` stays where it is (the sim's ChatML
  template takes a system message anywhere, so vLLM would not merge it).
* a string ``content``: the message as is. Blocks: ``text`` parts (one alone becomes
  a string), ``image`` an ``image_url`` part (64 tokens to the sim's tokenizer),
  ``thinking`` the message's ``reasoning``, ``tool_use`` a ``tool_calls`` entry whose
  arguments are Python's ``json.dumps`` of ``input`` (``", "`` and ``": "``, as
  vLLM writes them), ``tool_result`` in a user message a ``tool`` message before it
  (text parts joined by newlines); a user message left with no content is dropped.
* ``tools``: chat function tools; ``tool_choice`` auto, any (required), none, or a
  named tool; tools without one mean ``auto``, which the sim (like a vLLM started
  without ``--enable-auto-tool-choice``) refuses.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

#: Builds the 400 for what vLLM's request model would not parse.
Invalid = Callable[[str], Exception]

Message = dict[str, Any]

_BILLING = "x-anthropic-billing-header"
_BLOCKS = frozenset(
    {
        "text",
        "image",
        "tool_use",
        "tool_result",
        "tool_reference",
        "thinking",
        "redacted_thinking",
        "tool_addition",
        "tool_removal",
    }
)
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def chat_request(payload: dict[str, Any], invalid: Invalid) -> dict[str, Any]:
    """The chat request: ``messages``, and ``tools``/``tool_choice`` when given."""
    messages: list[Message] = []
    system = _system_text(payload.get("system"), invalid)
    if system:
        messages.append({"role": "system", "content": system})
    given = payload.get("messages")
    if not isinstance(given, list):
        raise invalid("messages: Field required")
    for message in given:
        _add(messages, _checked(message, invalid))
    chat: dict[str, Any] = {"messages": messages}
    tools = payload.get("tools")
    if tools is not None:
        chat["tools"] = [_tool(tool, invalid) for tool in _list(tools, "tools", invalid)]
        chat["tool_choice"] = "auto"
    choice = payload.get("tool_choice")
    if choice is not None:
        chat["tool_choice"] = _tool_choice(choice, invalid)
    return chat


def _list(value: Any, name: str, invalid: Invalid) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise invalid(f"{name}: Input should be a valid list of objects")
    return value


def _checked(message: Any, invalid: Invalid) -> dict[str, Any]:
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
        raise invalid("messages: each message needs a role: user, assistant or system")
    content = message.get("content")
    if isinstance(content, list):
        for block in _list(content, "messages.content", invalid):
            if block.get("type") not in _BLOCKS:
                raise invalid(f"messages.content: unknown block type {block.get('type')!r}")
    elif not isinstance(content, str):
        raise invalid("messages.content: Input should be a valid string or list of blocks")
    return message


def _system_text(system: Any, invalid: Invalid) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    blocks = _list(system, "system", invalid)
    return "".join(_texts(blocks))


def _texts(blocks: list[dict[str, Any]]) -> list[str]:
    texts = [b.get("text") for b in blocks if b.get("type") == "text"]
    return [t for t in texts if isinstance(t, str) and t and not t.startswith(_BILLING)]


def _add(messages: list[Message], message: dict[str, Any]) -> None:
    role, content = message["role"], message["content"]
    if role == "system":
        text = "".join(_texts(content)) if isinstance(content, list) else content
        if text and not text.startswith(_BILLING):
            messages.append({"role": "system", "content": text})
        return
    out: Message = {"role": role}
    if isinstance(content, str):
        out["content"] = content
    else:
        _convert_blocks(content, out, messages)
    if role != "user" or "content" in out:
        messages.append(out)


def _convert_blocks(blocks: list[dict[str, Any]], out: Message, messages: list[Message]) -> None:
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and isinstance(block.get("source"), dict):
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block["source"])}})
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            reasoning.append(block["thinking"])
        elif kind == "tool_use":
            calls.append(_call(block))
        elif kind == "tool_result" and out["role"] == "user":
            messages.extend(_tool_messages(block))
        elif kind == "tool_result":
            parts.append({"type": "text", "text": f"Tool result: {block.get('content') or ''}"})
    if reasoning:
        out["reasoning"] = "".join(reasoning)
    if calls:
        out["tool_calls"] = calls
    if len(parts) == 1 and parts[0]["type"] == "text":
        out["content"] = parts[0]["text"]
    elif parts:
        out["content"] = parts


def _call(block: dict[str, Any]) -> dict[str, Any]:
    arguments = json.dumps(block.get("input") or {})
    call_id = block.get("id") or f"call_{int(time.time())}"
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": block.get("name") or "", "arguments": arguments},
    }


def _tool_messages(block: dict[str, Any]) -> list[Message]:
    content = block.get("content")
    call_id = block.get("tool_use_id") or ""
    images: list[str] = []
    text = content if isinstance(content, str) else ""
    if isinstance(content, list):
        items = [item for item in content if isinstance(item, dict)]
        text = "\n".join(i.get("text", "") for i in items if i.get("type") == "text")
        images = [_image_url(i.get("source") or {}) for i in items if i.get("type") == "image"]
    out: list[Message] = [{"role": "tool", "tool_call_id": call_id, "content": text}]
    if images:
        out.append(
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": url}} for url in images],
            }
        )
    return out


def _image_url(source: dict[str, Any]) -> str:
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _tool(tool: dict[str, Any], invalid: Invalid) -> dict[str, Any]:
    schema = tool.get("input_schema")
    if not isinstance(tool.get("name"), str) or not isinstance(schema, dict):
        raise invalid("tools: each tool needs a name and an input_schema object")
    function = {
        "name": tool["name"],
        "description": tool.get("description"),
        "parameters": {"type": "object", **schema},
        "strict": tool.get("strict"),
        "defer_loading": tool.get("defer_loading"),
    }
    return {"type": "function", "function": function}


def _tool_choice(choice: Any, invalid: Invalid) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in _CHOICES:
        return _CHOICES[kind]
    if kind == "tool" and isinstance(choice.get("name"), str) and choice["name"]:
        return {"type": "function", "function": {"name": choice["name"]}}
    raise invalid("tool_choice: type must be auto, any, tool (with a name) or none")
