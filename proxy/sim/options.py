"""The chat options a client tries first, answered the way vLLM answers them.

``n`` (that many choices), ``logprobs``/``top_logprobs`` (vLLM's
``ChatCompletionLogProbs`` shape), ``response_format`` (``json_object`` and
``json_schema`` honoured minimally: the content is valid JSON, for a schema a small
instance of it) and ``tool_choice`` (a named function or ``required``: one call with
arguments built from the tool's parameter schema; ``auto``, also the default when
``tools`` are given, is refused as a vLLM started without ``--enable-auto-tool-choice``
refuses it). The checks and their messages are those of vLLM's
``chat_completion/protocol.py`` (``check_logprobs``, ``check_tool_usage``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

#: Builds the dialect's 400 from a message and the offending field.
Refuse = Callable[[str, "str | None"], Exception]

#: vLLM's default ``--max-logprobs``.
MAX_LOGPROBS = 20
_AUTO_TOOLS = (
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
)


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ChatOptions:
    n: int = 1
    logprobs: bool = False
    top_logprobs: int = 0
    content: str | None = None
    """The content that replaces the sim's words (JSON for a ``response_format``)."""
    tool_call: ToolCall | None = None


def _lax_int(value: Any) -> Any:
    """``n`` as vLLM's pydantic (lax mode) reads it: ``"3"`` and ``3.0`` are 3, ``true``
    is 1, null the default; anything else as it is (and refused)."""
    if value is None:
        return 1
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value.strip())
    return value


def parse_options(payload: dict[str, Any], bad: Refuse) -> ChatOptions:
    """The options of a chat request; ``bad`` makes the error that is raised."""
    n = _lax_int(payload.get("n", 1))
    if not isinstance(n, int) or n < 1:
        raise bad("n must be at least 1, got " + repr(n), "n")
    logprobs = bool(payload.get("logprobs"))
    top = payload.get("top_logprobs")
    top = 0 if top is None else top
    if not isinstance(top, int) or isinstance(top, bool):
        raise bad("`top_logprobs` must be an integer.", "top_logprobs")
    if top < 0 and top != -1:
        raise bad("`top_logprobs` must be a positive value or -1.", "top_logprobs")
    if top != 0 and not logprobs:
        raise bad("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
    if top > MAX_LOGPROBS:
        raise bad(
            f"Requested sample logprobs of {top}, which is greater than max allowed: "
            f"{MAX_LOGPROBS}",
            "top_logprobs",
        )
    top = MAX_LOGPROBS if top == -1 else top
    return ChatOptions(
        n=n,
        logprobs=logprobs,
        top_logprobs=top,
        content=_formatted(payload.get("response_format"), bad),
        tool_call=_tool_call(payload, bad),
    )


def _formatted(response_format: Any, bad: Refuse) -> str | None:
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return orjson.dumps({"text": "Hello from the simulated upstream."}).decode()
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise bad("response_format.json_schema.schema is required", "response_format")
        return orjson.dumps(instance_of(schema)).decode()
    raise bad(
        f"response_format: type {kind!r} is not one of 'text', 'json_object', 'json_schema'",
        "response_format",
    )


def _tool_call(payload: dict[str, Any], bad: Refuse) -> ToolCall | None:
    tools = payload.get("tools")
    if tools == []:
        raise bad(
            "`tools` must not be an empty array. Either provide at least one tool or omit "
            "the field entirely.",
            "tools",
        )
    # vLLM: tools without a tool_choice mean "auto".
    choice = payload.get("tool_choice", "auto" if tools else "none")
    if choice is None or choice == "none":
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise bad("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if choice == "auto":
        raise bad(_AUTO_TOOLS, None)
    functions = [t.get("function") for t in tools if isinstance(t.get("function"), dict)]
    if choice == "required":
        chosen = functions[0] if functions else None
    elif isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        chosen = next((f for f in functions if f.get("name") == name), None)
        if chosen is None:
            raise bad(
                "The tool specified in `tool_choice` does not match any of the specified `tools`",
                "tool_choice",
            )
    else:
        raise bad(
            f'Invalid value for `tool_choice`: {choice}! Only named tools, "none", "auto" or '
            '"required" are supported.',
            "tool_choice",
        )
    if chosen is None or not isinstance(chosen.get("name"), str):
        raise bad("each tool needs a function with a name", "tools")
    schema = chosen.get("parameters")
    arguments = instance_of(schema) if isinstance(schema, dict) else {}
    return ToolCall(chosen["name"], orjson.dumps(arguments).decode())


def instance_of(schema: dict[str, Any], depth: int = 0) -> Any:
    """A small value that satisfies ``schema`` (the common JSON-schema keywords)."""
    if depth > 8:
        return None
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options and isinstance(options[0], dict):
            return instance_of(options[0], depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind == "object" or (kind is None and "properties" in schema):
        properties = schema.get("properties") or {}
        required = schema.get("required") or list(properties)
        return {
            name: instance_of(properties.get(name) or {}, depth + 1)
            for name in required
            if isinstance(name, str)
        }
    if kind == "array":
        found = schema.get("items")
        items: dict[str, Any] = found if isinstance(found, dict) else {}
        return [instance_of(items, depth + 1) for _ in range(int(schema.get("minItems") or 0))]
    if kind == "string":
        return "sim" * max(1, -(-int(schema.get("minLength") or 0) // 3))
    if kind == "integer":
        return int(schema.get("minimum") or 0)
    if kind == "number":
        return float(schema.get("minimum") or 0)
    if kind == "boolean":
        return False
    return None


def pieces(text: str, count: int) -> list[str]:
    """``text`` cut into ``count`` tokens (the sim's tokens, for pacing and logprobs)."""
    if count <= 0:
        return []
    size = -(-len(text) // count) or 1
    out = [text[i : i + size] for i in range(0, len(text), size)]
    return out + [""] * (count - len(out))


def logprobs_of(tokens: list[str], top: int) -> dict[str, Any]:
    """vLLM's ``ChatCompletionLogProbs``: one entry per token, ``top`` alternatives each."""
    content = []
    for i, token in enumerate(tokens):
        logprob = -0.1 * (1 + i % 7)
        alternatives = [_entry(token, logprob)] + [
            _entry(f"{token.strip() or '_'}{k}", logprob - k) for k in range(1, top)
        ]
        content.append({**_entry(token, logprob), "top_logprobs": alternatives[:top]})
    return {"content": content}


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def tool_call_id() -> str:
    return f"chatcmpl-tool-{os.urandom(12).hex()}"
