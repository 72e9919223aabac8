"""Messages as vLLM hands them to the chat template.

vLLM does not render the request's messages as they are: it rebuilds each one
(``vllm/entrypoints/chat_utils.py``), and an exact count has to see what it sees:

- ``content: None`` becomes ``""``; a list of parts becomes its text parts joined
  with ``"\\n"`` when the template treats content as a string, or a list of
  ``{"type": "text"}`` / ``{"type": "image"}`` dicts when the template loops over
  content parts (detected from the template's syntax tree, as vLLM does);
- only ``role``, ``content``, ``name``, ``tool_calls`` (assistant),
  ``tool_call_id`` (tool), ``reasoning`` (assistant, also copied to
  ``reasoning_content``), ``tools`` (developer) survive;
- a tool call's ``arguments`` JSON string is parsed to a dict (``{}`` when it is
  not valid JSON), and an empty ``tool_calls`` list is dropped;
- where the template never names the ``developer`` role (``supports_developer``),
  a developer message is rendered as a system message (no ``tools`` key), and then
  every system message is merged into one at the start (``merged_systems``):
  ``vllm/renderers/hf.py``, ``safe_apply_chat_template``.

The request's own dicts are never modified: they are forwarded upstream later.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Literal

import jinja2
import jinja2.nodes as nodes
import orjson

from proxy.types import Message

ContentFormat = Literal["string", "openai"]

_TEXT_KEYS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
_MEDIA = {
    "image_url": "image",
    "input_image": "image",
    "image_pil": "image",
    "image_embeds": "image",
    "audio_url": "audio",
    "input_audio": "audio",
    "audio_embeds": "audio",
    "video_url": "video",
}


def _part(part: Any) -> tuple[str, str | None]:
    """(kind, text): kind is "text", a media modality, or "" for a part vLLM skips."""
    if isinstance(part, str):
        return "text", part
    if not isinstance(part, dict):
        return "", None
    kind = part.get("type")
    if kind in _TEXT_KEYS:
        text = part.get(_TEXT_KEYS[kind])
        return ("text", text) if isinstance(text, str) else ("", None)
    if kind in _MEDIA:
        return _MEDIA[kind], None
    for key, modality in _MEDIA.items():  # parts without a type but with a media key
        if kind is None and key in part:
            return modality, None
    return "", None


def _content(content: Any, fmt: ContentFormat, role: str) -> tuple[Any, int]:
    """The content vLLM renders, and how many media parts it held (counted apart)."""
    if fmt == "string" and content.__class__ is str:
        return content, 0  # what the loop below makes of it: one text part, joined
    if content is None:
        parts: list[Any] = []
    elif isinstance(content, str):
        parts = [content]
    elif isinstance(content, list):
        parts = content
    else:
        parts = [orjson.dumps(content).decode()]
    texts: list[str] = []
    wrapped: list[dict[str, str]] = []
    media = 0
    for part in parts:
        kind, text = _part(part)
        if kind == "text" and text is not None:
            texts.append(text)
            wrapped.append({"type": "text", "text": text})
        elif kind:
            media += 1
            wrapped.append({"type": kind})
    if fmt == "string" or (role == "tool" and media == 0):
        return "\n".join(texts), media
    return wrapped, media


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return {}
    return value if isinstance(value, (dict, list)) else {}


def _tool_calls(calls: list[Any]) -> list[Any]:
    out: list[Any] = []
    for call in calls:
        if isinstance(call, dict) and isinstance(call.get("function"), dict):
            function = dict(call["function"])
            function["arguments"] = _arguments(function.get("arguments"))
            out.append({**call, "function": function})
        else:
            out.append(call)
    return out


def supports_developer(template: str) -> bool:
    """Whether vLLM hands the template developer messages as they are: it looks for
    the role's name, quoted, in the template's source."""
    return '"developer"' in template or "'developer'" in template


def has_developer(messages: Sequence[Message]) -> bool:
    return any(m.get("role") == "developer" for m in messages)


def as_system(messages: Sequence[Message]) -> list[Message]:
    """The messages with each developer message's role system (shallow copies)."""
    return [{**m, "role": "system"} if m.get("role") == "developer" else m for m in messages]


def merged_systems(conversation: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """vLLM's merge of the system messages after developer ones became system: one at
    the start, their non-empty texts joined by a blank line, the rest in order; None
    when there is nothing to merge (at most one system message, and it is first)."""
    systems = [i for i, m in enumerate(conversation) if m.get("role") == "system"]
    if not systems or systems == [0]:
        return None
    texts: list[str] = []
    for i in systems:
        content = conversation[i].get("content") or ""
        if isinstance(content, list):
            content = "\n".join(
                p if isinstance(p, str) else p["text"]
                for p in content
                if isinstance(p, str) or (isinstance(p, dict) and "text" in p)
            )
        if content:
            texts.append(content)
    rest = [m for m in conversation if m.get("role") != "system"]
    return [{"role": "system", "content": "\n\n".join(texts)}, *rest]


def to_conversation(
    messages: Sequence[Message], fmt: ContentFormat
) -> tuple[list[dict[str, Any]], list[int]]:
    """The conversation vLLM renders, and the media parts of each message.

    A message of a role and a string, in that order, is what vLLM would rebuild it
    as: it goes on as it is, not copied (the template only reads it). Most of a chat
    is such messages, and the copy was most of this function's cost.
    """
    conversation: list[dict[str, Any]] = []
    media: list[int] = []
    strings = fmt == "string"
    for message in messages:
        if (
            strings
            and len(message) == 2
            and message.get("content").__class__ is str
            and next(iter(message)) == "role"
            and message["role"].__class__ is str
            and message["role"] != "developer"  # vLLM gives it a tools key
        ):
            conversation.append(message)
            media.append(0)
            continue
        role = message.get("role")
        role = role if isinstance(role, str) else str(role)
        content, n_media = _content(message.get("content"), fmt, role)
        out: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant":
            calls = message.get("tool_calls")
            if isinstance(calls, list) and calls:
                out["tool_calls"] = _tool_calls(calls)
            reasoning = message.get("reasoning")
            if reasoning is not None:
                out["reasoning"] = reasoning
                out["reasoning_content"] = reasoning
        elif role == "tool" and "tool_call_id" in message:
            out["tool_call_id"] = message["tool_call_id"]
        if isinstance(message.get("name"), str):
            out["name"] = message["name"]
        if role == "developer":
            out["tools"] = message.get("tools")
        conversation.append(out)
        media.append(n_media)
    return conversation, media


# --- which content format the template expects ------------------------------------


def _reads(node: nodes.Node, names: set[str], key: str | None = None) -> bool:
    """Does ``node`` read one of ``names`` (or its ``key``), maybe sliced or filtered?"""
    while True:
        inner: nodes.Node | None = None
        sliced = isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice)
        if isinstance(node, (nodes.Filter, nodes.Test, nodes.Getitem)) and (
            sliced or not isinstance(node, nodes.Getitem)
        ):
            inner = node.node
        if inner is None:
            break
        node = inner
    if key is None:
        return isinstance(node, nodes.Name) and node.name in names
    if isinstance(node, nodes.Getitem):
        hit = isinstance(node.arg, nodes.Const) and node.arg.value == key
    elif isinstance(node, nodes.Getattr):
        hit = node.attr == key
    else:
        return False
    return hit and _reads(node.node, names)


def _loop_targets(tree: nodes.Template, names: set[str], key: str | None) -> Iterator[str]:
    for loop in tree.find_all(nodes.For):
        if _reads(loop.iter, names, key) and isinstance(loop.target, nodes.Name):
            yield loop.target.name


def detect_content_format(template: str, env: jinja2.Environment) -> ContentFormat:
    """ "openai" when the template loops over a message's content parts, else "string".

    Follows aliases (``{% set loop_messages = messages[1:] %}``) one assignment at a
    time; no control-flow analysis, like vLLM's own detection.
    """
    try:
        tree = env.parse(template)
    except jinja2.TemplateSyntaxError:
        return "string"
    aliases = {"messages"}
    grew = True
    while grew:
        grew = False
        for assign in tree.find_all(nodes.Assign):
            target = assign.target
            fresh = isinstance(target, nodes.Name) and target.name not in aliases
            if fresh and isinstance(target, nodes.Name) and _reads(assign.node, aliases):
                aliases.add(target.name)
                grew = True
    message_vars = set(_loop_targets(tree, aliases, None))
    if not message_vars:
        return "string"
    return "openai" if any(True for _ in _loop_targets(tree, message_vars, "content")) else "string"
