"""What the Messages route refuses itself, in Anthropic's envelope, rather than forward
a request vLLM would answer in OpenAI's (docs/dialects.md): ``model`` and
``max_tokens`` are required (Anthropic's API has no default for either), roles are
``user`` and ``assistant`` (and vLLM's inline ``system``), and content blocks are the
kinds vLLM's Messages server converts; anything else (``document``, ``search_result``,
role ``tool``) would be dropped or refused upstream in the wrong envelope.
"""

from __future__ import annotations

from proxy.errors import InvalidRequest
from proxy.types import JSONObject

ROLES = frozenset(("user", "assistant", "system"))
#: The block kinds served: what ``messages_chat`` converts, and the tool-search
#: blocks that change the tool list (``tool_reference``, ``tool_addition``,
#: ``tool_removal``).
BLOCKS = frozenset(
    (
        "text",
        "image",
        "tool_use",
        "tool_result",
        "thinking",
        "redacted_thinking",
        "tool_reference",
        "tool_addition",
        "tool_removal",
    )
)


def check_messages(body: JSONObject) -> None:
    """Roles and block kinds; the list's shape is checked by the parse, which notes
    the roles and kinds in its own pass and runs this (for the error's words) only
    when one is not served."""
    for i, message in enumerate(body.get("messages") or ()):
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role not in ROLES:
            raise InvalidRequest(
                f"messages[{i}].role must be 'user' or 'assistant', not {str(role)[:32]!r}; "
                "a tool's result goes in a user message as a 'tool_result' block.",
                param="messages",
            )
        content = message.get("content")
        for j, block in enumerate(content if isinstance(content, list) else ()):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind not in BLOCKS:
                raise InvalidRequest(
                    f"messages[{i}].content[{j}]: block type {str(kind)[:32]!r} is not "
                    f"served through this proxy; send one of {', '.join(sorted(BLOCKS))}.",
                    param="messages",
                )


def check_create(body: JSONObject) -> None:
    """``POST /v1/messages``: ``model`` and ``max_tokens`` required."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise InvalidRequest("'model': field required.", param="model")
    if body.get("max_tokens") is None:
        raise InvalidRequest("'max_tokens': field required.", param="max_tokens")
