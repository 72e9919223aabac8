"""Responses items as the chat messages vLLM renders for them, for counting.

The same conversion as vLLM 0.32's ``construct_input_messages`` and
``_construct_message_from_response_item`` (vllm/entrypoints/openai/responses/utils.py),
written from reading it:

- ``instructions`` becomes a system message; a string ``input`` one user message;
- a ``function_call`` (or ``custom_tool_call``) becomes a tool call on the previous
  message when that is an assistant message, else an assistant message of its own;
  a ``reasoning`` item fills the previous assistant message's ``reasoning`` when it
  has none, and an assistant message item its ``content`` likewise; so a run of
  reasoning, message and calls is one chat message, owned by the run's first item;
- a ``*call_output`` item becomes a tool message;
- any other item with a ``role`` passes as it is (vLLM hands the item itself on);
- an item with no role and no known type yields no message (vLLM refuses it: it
  counts for nothing here, and the engine answers 400).

The tools: ``construct_tool_dicts``: function tools in the chat form, namespace tools
flattened to ``<namespace>__<name>``, custom tools as a one-string function shim,
every other tool type dropped.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from proxy.dialects.conversation import Conversation
from proxy.types import JSONObject, Message

_CALLS = frozenset(("function_call", "custom_tool_call"))
_OUTPUTS = frozenset(("function_call_output", "custom_tool_call_output"))
_SEPARATOR = "__"  # vLLM's flat name of a namespace's function
_CUSTOM_INPUT = "input"
_CUSTOM_PARAMETERS: JSONObject = {
    "type": "object",
    "properties": {
        _CUSTOM_INPUT: {"type": "string", "description": "The freeform text payload for this tool."}
    },
    "required": [_CUSTOM_INPUT],
    "additionalProperties": False,
}


def to_chat(conv: Conversation, kept: Sequence[int]) -> tuple[list[Message], list[int]]:
    """The chat messages vLLM builds from the kept items, and each one's item index."""
    messages: list[Message] = []
    owner: list[int] = []
    items = conv.items
    head = conv.head
    for i in kept:
        item = items[i]
        if i < head:
            message: Message | None = {"role": "system", "content": item}
        elif isinstance(item, str):
            message = {"role": "user", "content": item}
        else:
            # A plain message item, the common one, decided here without a call to
            # ``_from_item`` (the same outcome: every request's every item passes here,
            # docs/performance.md §5b): a user, system or developer message is passed on
            # as it is, an assistant's text after anything but an assistant message is
            # a message of its own.
            kind = item.get("type")
            role = item.get("role")
            content = item.get("content")
            if (kind is None or kind == "message") and role is not None:
                if role != "assistant":
                    messages.append(item)
                    owner.append(i)
                    continue
                if content.__class__ is str and (
                    not messages or messages[-1].get("role") != "assistant"
                ):
                    messages.append({"role": "assistant", "content": content})
                    owner.append(i)
                    continue
            message = _from_item(item, messages[-1] if messages else None)
        if message is not None:
            messages.append(message)
            owner.append(i)
    return messages, owner


def _from_item(item: JSONObject, prev: Message | None) -> Message | None:
    """The new message for ``item``, or None when it went into ``prev`` (or nowhere).

    ``prev`` is always a message this module built, never the client's object, so
    writing into it changes nothing the proxy forwards.
    """
    assistant = prev if prev is not None and prev.get("role") == "assistant" else None
    kind = item.get("type")
    if kind in _CALLS:
        return _with_call(assistant, _tool_call(item))
    if kind == "reasoning":
        reasoning = _reasoning(item)
        if assistant is not None and assistant.get("reasoning") is None:
            assistant["reasoning"] = reasoning
            return None
        return {"role": "assistant", "reasoning": reasoning}
    if kind in _OUTPUTS:
        return {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
    role = item.get("role")
    if role == "assistant":
        text = _first_text(item.get("content"))
        if text is not None:
            if assistant is not None and assistant.get("content") is None:
                assistant["content"] = text
                return None
            return {"role": "assistant", "content": text}
        return dict(item)  # passed on whole; a copy, as a later item may write into it
    if role is not None:
        return item
    return None


def _with_call(assistant: Message | None, call: JSONObject) -> Message | None:
    if assistant is not None:
        calls = assistant.get("tool_calls")
        if calls is None:
            assistant["tool_calls"] = [call]
            return None
        if isinstance(calls, list):
            # A new list: the old one may be the client's (an assistant item passed on).
            assistant["tool_calls"] = [*calls, call]
            return None
    return {"role": "assistant", "tool_calls": [call]}


def _tool_call(item: JSONObject) -> JSONObject:
    name = item.get("name")
    if item.get("type") == "custom_tool_call":
        payload = item.get(_CUSTOM_INPUT) or ""
        arguments: Any = json.dumps({_CUSTOM_INPUT: payload}, ensure_ascii=False)
    else:
        arguments = item.get("arguments")
        namespace = item.get("namespace")
        if namespace:
            name = f"{namespace}{_SEPARATOR}{name}"
    return {
        "id": item.get("call_id"),
        "function": {"name": name, "arguments": arguments},
        "type": "function",
    }


def _reasoning(item: JSONObject) -> str:
    """The reasoning text vLLM keeps: the first content part's, else the first summary
    part's, else nothing."""
    for field in ("content", "summary"):
        parts = item.get(field)
        if isinstance(parts, list) and parts:
            text = _text_of(parts[0])
            return text if text is not None else ""
    return ""


def _first_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        return _text_of(content[0])
    return None


def _text_of(part: Any) -> str | None:
    text = part.get("text") if isinstance(part, dict) else None
    return text if isinstance(text, str) else None


def chat_tools(tools: Any) -> list[JSONObject] | None:
    """The tools vLLM hands to the chat template: None without tools, else the function
    tools in chat form (an empty list when none of the tools is a function)."""
    if not isinstance(tools, list) or not tools:
        return None
    out: list[JSONObject] = []
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        kind = tool.get("type")
        if kind == "function":
            out.append(_function(tool.get("name"), tool))
        elif kind == "custom":
            shim = {"description": tool.get("description"), "parameters": _CUSTOM_PARAMETERS}
            out.append(_function(tool.get("name"), shim))
        elif kind == "namespace":
            inner = tool.get("tools")
            for member in inner if isinstance(inner, list) else ():
                if isinstance(member, dict) and member.get("type") == "function":
                    flat = f"{tool.get('name')}{_SEPARATOR}{member.get('name')}"
                    out.append(_function(flat, member))
    return out


def _function(name: Any, tool: JSONObject) -> JSONObject:
    """vLLM's ``FunctionDefinition`` as it dumps: name, description and parameters
    always, ``strict`` and ``defer_loading`` only when set."""
    function: JSONObject = {
        "name": name,
        "description": tool.get("description"),
        "parameters": tool.get("parameters"),
    }
    for optional in ("strict", "defer_loading"):
        if tool.get(optional) is not None:
            function[optional] = tool[optional]
    return {"type": "function", "function": function}
