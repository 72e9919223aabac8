"""vLLM 0.32's ``POST /v1/responses`` (``openai/responses/serving.py``, ``protocol.py``,
``api_router.py``), as a vLLM started without a tool parser, a reasoning parser or
``VLLM_ENABLE_RESPONSES_API_STORE`` answers it: one assistant ``message`` out.

The input becomes chat messages (``responses_input.py``), counted and cached like a
chat prompt (``prompt.py``). The response store is off, as it is by default:
``store: true`` is silently not stored, ``background: true`` is refused (400),
``previous_response_id`` and ``GET /v1/responses/{id}`` are 404 ("not found"), and
``DELETE`` is no route of vLLM's (405). ``tools`` are accepted and echoed (the sim's
tokenizer does not render them, as for chat); with no tool parser the answer is text.

The stream is vLLM's: ``event: TYPE`` and ``data: {...}`` per event, with
``sequence_number`` from 0; ``response.created``, ``response.in_progress``,
``response.output_item.added``, ``response.content_part.added``, one
``response.output_text.delta`` per token, ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done``, and always
``response.completed`` (its response's status ``incomplete`` when cut short).

An input whose last item is an assistant message with status ``incomplete`` or
``in_progress`` is continued (vLLM's ``should_continue_final_message``: the chat
template's ``continue_final_message``, no generation prompt): the sim's answer goes on
from where that message's text ends, as on the chat route.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import count
from typing import Any

import orjson
from aiohttp import web

from proxy.sim import prompt
from proxy.sim.config import SimConfig
from proxy.sim.dialect import Dialect, Plan, SimError, completion_text, words_in
from proxy.sim.generation import JSON_TYPE, generate
from proxy.sim.responses_input import Refuse, chat_messages, continues_final
from proxy.sim.routes import read_json
from proxy.sim.state import STATE

_NO_STORE = (
    "This vLLM engine does not support `store=True` and therefore does not support the "
    "background mode. To enable these features, set the environment variable "
    "`VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server."
)


def uuid_hex() -> str:
    """vLLM's ``random_uuid()``: 16 hex digits."""
    return os.urandom(8).hex()


def _not_found(dialect: Dialect, cfg: SimConfig, response_id: str) -> SimError:
    return dialect.error(
        cfg,
        404,
        f"Response with id '{response_id}' not found.",
        kind="invalid_request_error",
        param="response_id",
    )


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


@dataclass
class _Answer:
    """One response: its JSON body and its event stream."""

    payload: dict[str, Any]
    plan: Plan
    bound: int
    tool_choice: Any
    rid: str = field(default_factory=lambda: f"resp_{uuid_hex()}")
    mid: str = field(default_factory=lambda: f"msg_{uuid_hex()}")
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def words(self) -> list[str]:
        skip = self.plan.skip
        words = completion_text(skip + self.plan.completion_tokens)[skip:]
        if skip:  # a continued answer goes on after the words it holds
            return words
        return [words[0].lstrip(), *words[1:]] if words else []

    @property
    def text(self) -> str:
        return "".join(self.words)

    def response(self, status: str, output: list[Any], usage: Any) -> dict[str, Any]:
        """vLLM's ``ResponsesResponse.from_request``, fields in its order."""
        p = self.payload
        return {
            "id": self.rid,
            "created_at": self.created,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete"
            else None,
            "instructions": p.get("instructions"),
            "metadata": p.get("metadata"),
            "model": self.plan.model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": _or(p.get("parallel_tool_calls"), True),
            "temperature": _or(p.get("temperature"), 1.0),
            "tool_choice": self.tool_choice,
            "tools": p.get("tools") or [],
            "top_p": _or(p.get("top_p"), 1.0),
            "background": False,
            "max_output_tokens": self.bound,
            "max_tool_calls": p.get("max_tool_calls"),
            "previous_response_id": None,
            "prompt": None,
            "reasoning": p.get("reasoning"),
            "service_tier": _or(p.get("service_tier"), "auto"),
            "status": status,
            "text": p.get("text"),
            "top_logprobs": None,
            "truncation": _or(p.get("truncation"), "disabled"),
            "usage": usage,
            "user": p.get("user"),
            "presence_penalty": _or(p.get("presence_penalty"), 0.0),
            "frequency_penalty": _or(p.get("frequency_penalty"), 0.0),
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "input_messages": None,
            "output_messages": None,
        }

    def usage(self) -> dict[str, Any]:
        prompt_tokens, output = self.plan.prompt_tokens, self.plan.completion_tokens
        return {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {
                "cached_tokens": self.plan.cached_tokens,
                "cache_write_tokens": 0,
                "input_tokens_per_turn": [],
                "cached_tokens_per_turn": [],
            },
            "output_tokens": output,
            "output_tokens_details": {
                "reasoning_tokens": 0,
                "tool_output_tokens": 0,
                "output_tokens_per_turn": [],
                "tool_output_tokens_per_turn": [],
            },
            "total_tokens": prompt_tokens + output,
        }

    def part(self, text: str, logprobs: list[Any] | None) -> dict[str, Any]:
        return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}

    def item(self, status: str, content: list[Any]) -> dict[str, Any]:
        # The item is "completed" even when the response is not (vLLM's wording).
        return {
            "id": self.mid,
            "content": content,
            "role": "assistant",
            "status": status,
            "type": "message",
            "phase": None,
        }

    def final(self, streamed: bool) -> dict[str, Any]:
        """The finished response; streamed, its output is the items streamed (none when
        no text came), else one message whatever its text."""
        status = "incomplete" if self.plan.finish_reason == "length" else "completed"
        text = self.text
        content = [self.part(text, None)] if text else []
        output = [self.item("completed", content)] if text or not streamed else []
        return self.response(status, output, self.usage())

    def body(self) -> bytes:
        return orjson.dumps(self.final(streamed=False))

    def events(self) -> Iterator[bytes]:
        """One yield before the first token, one per token, then the tail."""
        numbers = count()

        def event(kind: str, **fields: Any) -> bytes:
            # The SDK's event models list their fields alphabetically; so does vLLM's JSON.
            data = dict(sorted({**fields, "type": kind, "sequence_number": next(numbers)}.items()))
            return f"event: {kind}\ndata: ".encode() + orjson.dumps(data) + b"\n\n"

        where = {"item_id": self.mid, "output_index": 0, "content_index": 0}
        opening = self.response("in_progress", [], None)
        head = [
            event("response.created", response=opening),
            event("response.in_progress", response=opening),
        ]
        if self.words:
            head.append(
                event(
                    "response.output_item.added", output_index=0, item=self.item("in_progress", [])
                )
            )
            head.append(event("response.content_part.added", **where, part=self.part("", [])))
        yield b"".join(head)
        for word in self.words:
            yield event("response.output_text.delta", **where, delta=word, logprobs=[])
        tail = []
        if self.words:
            text = self.text
            tail.append(event("response.output_text.done", **where, text=text, logprobs=[]))
            tail.append(event("response.content_part.done", **where, part=self.part(text, None)))
            tail.append(
                event(
                    "response.output_item.done",
                    output_index=0,
                    item=self.item("completed", [self.part(text, None)]),
                )
            )
        tail.append(event("response.completed", response=self.final(streamed=True)))
        yield b"".join(tail)


async def responses(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    cfg, dialect = state.config, state.dialect
    payload = await read_json(request, state)

    def invalid(message: str, param: str | None) -> SimError:
        return dialect.error(cfg, 400, message, kind="Bad Request", param=param)

    def refuse(message: str, param: str | None) -> SimError:
        return prompt.validation_error(dialect, cfg, message, param)

    tool_choice = _tool_choice(payload, invalid)
    if payload.get("background") and payload.get("store") is False:
        raise invalid("background can only be used when `store` is true", "background")
    model = dialect.check_model(cfg, payload.get("model"))
    if payload.get("background"):
        raise dialect.error(cfg, 400, _NO_STORE, kind="invalid_request_error", param="background")
    if payload.get("previous_response_id") is not None:
        raise _not_found(dialect, cfg, str(payload["previous_response_id"]))
    messages = chat_messages(payload, invalid, refuse)
    asked = _max_output_tokens(dialect, cfg, payload, invalid)
    continues = continues_final(payload)
    counted = prompt.count(cfg, messages, continues)
    prompt.check_window(dialect, cfg, counted[0])
    if counted[0] >= cfg.max_model_len:  # vLLM's own check for this route, after the renderer's
        raise dialect.error(
            cfg,
            400,
            f"The engine prompt length {counted[0]} exceeds the max_model_len "
            f"{cfg.max_model_len}. Please reduce prompt.",
            kind="invalid_request_error",
            param="input",
        )
    bound = prompt.completion_bound(dialect, cfg, counted[0], asked)
    skip = words_in(messages[-1].get("content") or "", stripped=True) if continues else 0
    plan = prompt.plan(cfg, model, counted, bound, skip=skip)
    answer = _Answer(payload, plan, bound, tool_choice)
    if plan.prompt_ids is not None:
        plan.answer = answer.text
    stream = answer.events() if payload.get("stream") else None
    return await generate(request, plan, stream, answer.body)


def _tool_choice(payload: dict[str, Any], invalid: Refuse) -> Any:
    """The request's ``tool_choice`` as vLLM's ``check_tool_usage`` leaves it: "none"
    when there are no tools (for "auto" too); "required" or a named tool without tools
    refused."""
    tools = payload.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) and "type" in t for t in tools)
    ):
        raise invalid("tools: each tool needs a type", "tools")
    choice = _or(payload.get("tool_choice"), "auto")
    if tools:
        return choice
    if choice in ("auto", "none"):
        return "none"
    if choice == "required":
        raise invalid(
            "Tool choice 'required' must be specified with 'tools' parameter.", "tool_choice"
        )
    raise invalid("Tool choice 'function' not found in 'tools' parameter.", "tool_choice")


def _max_output_tokens(
    dialect: Dialect, cfg: SimConfig, payload: dict[str, Any], invalid: Refuse
) -> int | None:
    asked = payload.get("max_output_tokens")
    if asked is None:
        return None
    if not isinstance(asked, int) or isinstance(asked, bool):
        raise invalid("max_output_tokens: Input should be a valid integer", "max_output_tokens")
    prompt.check_output_bound(dialect, cfg, asked, "max_output_tokens")
    return asked


async def retrieve(request: web.Request) -> web.StreamResponse:
    """``GET /v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel``: with the
    store off no response is ever found."""
    state = request.app[STATE]
    raise _not_found(state.dialect, state.config, request.match_info["response_id"])


async def no_delete(request: web.Request) -> web.StreamResponse:
    """vLLM has no ``DELETE`` on a response: FastAPI's 405 for the ``GET`` route."""
    return web.Response(
        body=b'{"detail":"Method Not Allowed"}',
        status=405,
        content_type=JSON_TYPE,
        headers={"Allow": "GET"},
    )
