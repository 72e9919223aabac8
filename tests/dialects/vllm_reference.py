"""vLLM's own conversion of Responses and Messages bodies to chat messages and tools.

Run by the vLLM venv's python (``tests/dialects/test_vllm_reference.py``), never
imported by the tests: it reads a JSON list of cases on stdin, ``{"dialect":
"responses" | "messages", "body": {...}, "merge": bool}``, and writes one result per
case, ``{"messages": [...], "tools": [...] | null}`` or ``{"error": "..."}``, the way
vLLM 0.32 builds them for the chat template (``construct_input_messages`` and
``construct_tool_dicts``; ``AnthropicServingMessages.to_chat_completion_request``).
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any


def _plain(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump()
    raise TypeError(f"not JSON: {type(value).__name__}")


def responses(body: dict[str, Any]) -> dict[str, Any]:
    from vllm.entrypoints.openai.responses.protocol import (  # type: ignore[import-not-found,unused-ignore]
        ResponsesRequest,
    )
    from vllm.entrypoints.openai.responses.utils import (  # type: ignore[import-not-found,unused-ignore]
        construct_input_messages,
        construct_tool_dicts,
    )

    request = ResponsesRequest.model_validate(body)
    messages = construct_input_messages(
        request_instructions=request.instructions, request_input=request.input
    )
    return {"messages": messages, "tools": construct_tool_dicts(request.tools, request.tool_choice)}


def messages(body: dict[str, Any], merge: bool) -> dict[str, Any]:
    from vllm.entrypoints.anthropic.protocol import (  # type: ignore[import-not-found,unused-ignore]
        AnthropicMessagesRequest,
    )
    from vllm.entrypoints.anthropic.serving import (  # type: ignore[import-not-found,unused-ignore]
        AnthropicServingMessages,
    )

    request = AnthropicMessagesRequest.model_validate(body)
    chat = AnthropicServingMessages.to_chat_completion_request(request, merge_inline_system=merge)
    tools = None if chat.tools is None else [tool.model_dump() for tool in chat.tools]
    return {"messages": chat.messages, "tools": tools}


def run(case: dict[str, Any]) -> dict[str, Any]:
    try:
        if case["dialect"] == "responses":
            return responses(case["body"])
        return messages(case["body"], bool(case.get("merge")))
    except Exception as exc:  # vLLM's refusal, reported per case
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def main() -> None:
    logging.disable(logging.WARNING)
    cases = json.load(sys.stdin)
    json.dump([run(case) for case in cases], sys.stdout, default=_plain)


if __name__ == "__main__":
    main()
