"""What ``/docs`` and ``/openapi.json`` say about the proxy's own routes.

Documentation only: the handlers read the raw request and return responses directly,
so none of these models validates or serializes anything (FastAPI hands a returned
``Response`` over as it is). The chat body is described, not parsed: every field the
client sends goes upstream, the ones below are those the proxy reads itself.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

DESCRIPTION = (
    "OpenAI-compatible proxy in front of a vLLM or FastChat server. "
    "`POST /v1/chat/completions` is trimmed to the token budget, then forwarded; "
    "any other `/v1/*` path, `POST /tokenize` and `POST /detokenize` are relayed to the "
    "upstream as they are (and are not listed here: the upstream's own API describes them)."
)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str


class ErrorEnvelope(BaseModel):
    """OpenAI's error object, the shape of every error the proxy answers itself."""

    error: ErrorDetail


class HealthBody(BaseModel):
    status: str


class ReadinessBody(BaseModel):
    status: str
    upstream: str
    upstream_ready: bool
    detail: str


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorEnvelope, "description": description}


CHAT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The upstream's completion, relayed as it comes (a server-sent "
        "event stream when `stream` is true). `X-Trimproxy-*` headers say what was trimmed.",
        "content": {"application/json": {}, "text/event-stream": {}},
    },
    400: _error("Invalid JSON, or a prompt that cannot fit even after trimming"),
    401: _error("Missing or wrong API key (TRIMPROXY_API_KEYS)"),
    409: _error("Session turn limit reached, or session expired"),
    413: _error("Body over TRIMPROXY_MAX_BODY_BYTES"),
    429: _error("Over TRIMPROXY_MAX_IN_FLIGHT, or no KV room in time"),
    502: _error("The upstream could not be reached or answered invalid HTTP"),
    504: _error("The upstream did not answer in time"),
}

_MESSAGE_SCHEMA = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string", "examples": ["user"]},
        "content": {"anyOf": [{"type": "string"}, {"type": "array"}, {"type": "null"}]},
    },
    "additionalProperties": True,
}

CHAT_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["model", "messages"],
                    "properties": {
                        "model": {"type": "string"},
                        "messages": {"type": "array", "items": _MESSAGE_SCHEMA},
                        "stream": {"type": "boolean", "default": False},
                        "max_tokens": {"type": "integer", "minimum": 1},
                        "max_completion_tokens": {"type": "integer", "minimum": 1},
                    },
                    "additionalProperties": True,
                }
            }
        },
    }
}
