"""A Responses API request's ``instructions`` and ``input`` as the chat conversation
vLLM 0.32 renders for it (``openai/responses/utils.py``: ``construct_input_messages``
and ``_construct_message_from_response_item``), so the sim counts what vLLM counts.

* ``instructions``: a system message first; a string ``input``: one user message.
* ``message`` items (user, system, developer): passed on with their content (a
  string or ``input_text`` parts, which the sim's tokenizer joins).
* an assistant message: its first part's text (only the first, as vLLM), merged into
  the assistant message before it when that one has no content yet.
* ``function_call``: an assistant ``tool_calls`` entry ``{id: call_id, function:
  {name, arguments}, type: function}``, merged into the assistant message before it
  (consecutive calls make one message).
* ``function_call_output``: a ``tool`` message ``{content: output, tool_call_id}``.
* ``reasoning``: the assistant's ``reasoning`` (its first content text, else its first
  summary text), merged like a call; ``encrypted_content`` is refused. The sim's
  template does not render ``reasoning``, so it costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Builds the error for a message and the parameter at fault.
Refuse = Callable[[str, str | None], Exception]

Message = dict[str, Any]

_ROLES = ("user", "assistant", "system", "developer")


def chat_messages(payload: dict[str, Any], invalid: Refuse, refuse: Refuse) -> list[Message]:
    """``invalid`` answers what vLLM's request model would not parse; ``refuse`` what
    its conversion refuses."""
    messages: list[Message] = []
    instructions = payload.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise invalid("instructions: Input should be a valid string", "instructions")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    given = payload.get("input")
    if isinstance(given, str):
        return [*messages, {"role": "user", "content": given}]
    if not isinstance(given, list):
        raise invalid("input: Field required (a string or a list of items)", "input")
    for item in given:
        if not isinstance(item, dict):
            raise invalid("input: each item should be a valid dictionary", "input")
        _add(messages, item, invalid, refuse)
    return messages


def _add(messages: list[Message], item: dict[str, Any], invalid: Refuse, refuse: Refuse) -> None:
    kind = item.get("type", "message" if "role" in item else None)
    last = messages[-1] if messages and messages[-1].get("role") == "assistant" else None
    if kind == "function_call":
        _merge_call(messages, last, _call(item, invalid))
    elif kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise invalid("input: function_call_output needs call_id and output", "input")
        messages.append(
            {"role": "tool", "content": item.get("output"), "tool_call_id": item["call_id"]}
        )
    elif kind == "reasoning":
        _merge(messages, last, "reasoning", _reasoning(item, invalid, refuse))
    elif kind == "message":
        role = item.get("role")
        if role not in _ROLES:
            raise invalid(f"input: a message's role must be one of {', '.join(_ROLES)}", "input")
        text = _assistant_text(item.get("content")) if role == "assistant" else None
        if text is not None:
            _merge(messages, last, "content", text)
        else:
            messages.append({"role": role, "content": item.get("content")})
    else:
        raise refuse(f"Unsupported input item type: {kind}", "input")


def _call(item: dict[str, Any], invalid: Refuse) -> dict[str, Any]:
    fields = (item.get("call_id"), item.get("name"), item.get("arguments"))
    if not all(isinstance(field, str) for field in fields):
        raise invalid("input: function_call needs call_id, name and arguments", "input")
    call_id, name, arguments = fields
    return {"id": call_id, "function": {"name": name, "arguments": arguments}, "type": "function"}


def _merge_call(messages: list[Message], last: Message | None, call: dict[str, Any]) -> None:
    if last is None:
        messages.append({"role": "assistant", "tool_calls": [call]})
    else:
        last.setdefault("tool_calls", []).append(call)


def _merge(messages: list[Message], last: Message | None, key: str, value: str) -> None:
    """Into the assistant message before, unless it already has ``key``."""
    if last is not None and last.get(key) is None:
        last[key] = value
    else:
        messages.append({"role": "assistant", key: value})


def _reasoning(item: dict[str, Any], invalid: Refuse, refuse: Refuse) -> str:
    summary = item.get("summary")
    if not isinstance(summary, list):
        raise invalid("input: a reasoning item needs a summary list", "input")
    if item.get("encrypted_content"):
        raise refuse("Encrypted content is not supported.", "input")
    for parts in (item.get("content"), summary):
        if isinstance(parts, list) and parts and isinstance(parts[0], dict):
            text = parts[0].get("text")
            return text if isinstance(text, str) else ""
    return ""


def _assistant_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and isinstance(content[0], dict):
        text = content[0].get("text")
        return text if isinstance(text, str) else None
    return None


def continues_final(payload: dict[str, Any]) -> bool:
    """vLLM's ``should_continue_final_message``: the last input item a message (or
    reasoning) item with status ``in_progress`` or ``incomplete``, to be continued."""
    given = payload.get("input")
    last = given[-1] if isinstance(given, list) and given else None
    if not isinstance(last, dict) or last.get("type", "message") not in ("message", "reasoning"):
        return False
    return last.get("status") in ("in_progress", "incomplete")
