"""vLLM 0.32's Anthropic Messages API (``anthropic/api_router.py``, ``serving.py``,
``protocol.py``): ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

vLLM serves a message as a chat completion converted both ways, so the sim does the
same: the request becomes chat (``messages_input.py``), counted, cached and generated
like a chat prompt (``prompt.py``, ``generation.py``), and the answer is the chat
answer in Anthropic's shape. The message ``id`` is the chat completion's
(``chatcmpl-...``), as vLLM's is; ``stop_sequence`` is left out of a whole answer
(vLLM drops the nulls) and written as null in the stream's ``message_delta``.

Errors: what the request model refuses (a missing ``max_tokens``, a bad block) is
FastAPI's validation 400 in vLLM's OpenAI envelope; what the chat stage refuses (an
unknown model, ``tool_choice`` auto, a prompt or ``max_tokens`` past the window) is
``{"type": "error", "error": {"type", "message"}}`` with the chat error's status and
type (``BadRequestError``, ``NotFoundError``).

The stream (``event: NAME`` and ``data: {...}``; no ``ping``): ``message_start`` (usage
with the prompt's tokens and 0 out), ``content_block_start`` with the first token,
one ``content_block_delta`` per token (``text_delta``, or ``input_json_delta`` for a
tool call), ``content_block_stop``, ``message_delta`` (``stop_reason``, usage),
``message_stop``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from proxy.sim import prompt
from proxy.sim.dialect import Plan, SimError, completion_text, new_chat_id
from proxy.sim.generation import generate
from proxy.sim.messages_input import chat_request
from proxy.sim.options import ChatOptions, parse_options, pieces, tool_call_id
from proxy.sim.routes import json_response, read_json
from proxy.sim.state import STATE, SimState


def anthropic_error(exc: SimError) -> SimError:
    """vLLM's ``translate_error_response``: the chat error's type and message in
    Anthropic's envelope, the status unchanged."""
    body: dict[str, Any] = exc.body if isinstance(exc.body, dict) else {"message": exc.body}
    nested = body.get("error")  # the legacy error style is flat
    inner: dict[str, Any] = nested if isinstance(nested, dict) else body
    error = {"type": inner.get("type"), "message": inner.get("message")}
    return SimError(exc.status, {"type": "error", "error": error})


def _check_fields(state: SimState, payload: dict[str, Any], *, max_tokens: bool) -> None:
    """The request model's own checks (FastAPI answers them before vLLM's handler)."""
    cfg, dialect = state.config, state.dialect
    if not isinstance(payload.get("model"), str) or not payload["model"]:
        raise dialect.invalid(cfg, "model: Field required (Model is required)")
    if max_tokens:
        value = payload.get("max_tokens")
        if not isinstance(value, int) or isinstance(value, bool):
            raise dialect.invalid(cfg, "max_tokens: Field required (a valid integer)")
        if value <= 0:
            raise dialect.invalid(cfg, "max_tokens: Value error, max_tokens must be positive")


def _render(
    state: SimState, payload: dict[str, Any], max_tokens: int | None
) -> tuple[str, ChatOptions, tuple[int, list[int] | None]]:
    """The chat stage, in vLLM's order: the model, the tool choice, the output bound,
    the prompt's length. Its errors are Anthropic's."""
    cfg, dialect = state.config, state.dialect
    chat = chat_request(payload, lambda message: dialect.invalid(cfg, message))
    try:
        model = dialect.check_model(cfg, payload.get("model"))
        options = parse_options(
            chat,
            lambda message, param: dialect.error(
                cfg, 400, message, kind="BadRequestError", param=param
            ),
        )
        if max_tokens is not None:
            prompt.check_output_bound(dialect, cfg, max_tokens, "max_completion_tokens")
        counted = prompt.count(cfg, chat["messages"])
        prompt.check_window(dialect, cfg, counted[0])
    except SimError as exc:
        raise anthropic_error(exc) from None
    return model, options, counted


@dataclass
class _Answer:
    """One message: its JSON body and its event stream."""

    plan: Plan
    mid: str = field(default_factory=new_chat_id)
    call_id: str = field(default_factory=tool_call_id)

    def tokens(self) -> list[str]:
        call, count = self.plan.options.tool_call, self.plan.completion_tokens
        if call is not None:
            return pieces(call.arguments, count)
        words = completion_text(count)
        return [words[0].lstrip(), *words[1:]] if words else []

    def stop_reason(self) -> str:
        if self.plan.finish_reason == "length":
            return "max_tokens"
        return "end_turn" if self.plan.options.tool_call is None else "tool_use"

    def usage(self, output: int) -> dict[str, int]:
        return {"input_tokens": self.plan.prompt_tokens, "output_tokens": output}

    def content(self) -> list[dict[str, Any]]:
        call = self.plan.options.tool_call
        if call is None:
            return [{"type": "text", "text": "".join(self.tokens())}]
        return [
            {
                "type": "tool_use",
                "id": self.call_id,
                "name": call.name,
                "input": orjson.loads(call.arguments),
            }
        ]

    def body(self) -> bytes:
        body = {
            "id": self.mid,
            "type": "message",
            "role": "assistant",
            "content": self.content(),
            "model": self.plan.model,
            "stop_reason": self.stop_reason(),
            "usage": self.usage(self.plan.completion_tokens),
        }
        return orjson.dumps(body)

    def _block(self) -> tuple[dict[str, Any], str, str]:
        """The block the stream opens, and its delta's type and field."""
        call = self.plan.options.tool_call
        if call is None:
            return {"type": "text", "text": ""}, "text_delta", "text"
        block = {"type": "tool_use", "id": self.call_id, "name": call.name, "input": {}}
        return block, "input_json_delta", "partial_json"

    def events(self) -> Iterator[bytes]:
        """One yield before the first token, one per token, then the tail."""

        def event(kind: str, **data: Any) -> bytes:
            line = orjson.dumps({"type": kind, **data})
            return f"event: {kind}\ndata: ".encode() + line + b"\n\n"

        message: dict[str, Any] = {
            "id": self.mid,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self.plan.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": self.usage(0),
        }
        yield event("message_start", message=message)
        block, delta_type, key = self._block()
        opened = False
        for token in self.tokens():
            out = []
            if not opened and (token or delta_type == "input_json_delta"):
                out.append(event("content_block_start", content_block=block, index=0))
                opened = True
            if token:
                out.append(
                    event("content_block_delta", delta={"type": delta_type, key: token}, index=0)
                )
            yield b"".join(out)
        tail = [event("content_block_stop", index=0)] if opened else []
        tail.append(
            event(
                "message_delta",
                delta={"stop_reason": self.stop_reason(), "stop_sequence": None},
                usage=self.usage(self.plan.completion_tokens),
            )
        )
        tail.append(event("message_stop"))
        yield b"".join(tail)


async def messages(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    cfg = state.config
    payload = await read_json(request, state)
    _check_fields(state, payload, max_tokens=True)
    model, options, counted = _render(state, payload, payload["max_tokens"])
    try:
        bound = prompt.completion_bound(state.dialect, cfg, counted[0], payload["max_tokens"])
    except SimError as exc:
        raise anthropic_error(exc) from None
    plan = prompt.plan(cfg, model, counted, bound, options)
    answer = _Answer(plan)
    if plan.prompt_ids is not None and options.tool_call is None:
        plan.answer = "".join(answer.tokens())
    stream = answer.events() if payload.get("stream") else None
    return await generate(request, plan, stream, answer.body)


async def count_tokens(request: web.Request) -> web.StreamResponse:
    """The prompt's tokens as ``/v1/messages`` would count them; nothing generated,
    nothing cached."""
    state = request.app[STATE]
    payload = await read_json(request, state)
    _check_fields(state, payload, max_tokens=False)
    _, _, (tokens, _) = _render(state, payload, None)
    return json_response(
        {"input_tokens": tokens, "context_management": {"original_input_tokens": tokens}}
    )
