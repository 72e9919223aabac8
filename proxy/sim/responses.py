"""vLLM's ``POST /v1/responses``, minimally: text in, one assistant message out.

``input`` is a string or a list of messages (``content`` a string or
``input_text`` parts), ``instructions`` a system message before them,
``max_output_tokens`` the completion bound. The answer has the shape of vLLM's
``ResponsesResponse`` (``object: "response"``, one ``message`` output item with one
``output_text`` part, ``usage`` with ``input_tokens``/``output_tokens``); with
``stream: true`` it is the event stream of the Responses API (``response.created``,
``response.output_text.delta`` per token, ..., ``response.completed``). Tools and
stored responses (``previous_response_id``) are refused with a 400, not ignored.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import orjson
from aiohttp import web

from proxy.sim.dialect import Plan, SimError, completion_text, rand_id
from proxy.sim.generation import generate
from proxy.sim.state import STATE
from proxy.sim.tokenizer import prompt_tokens


def _messages(cfg_error: Any, payload: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    instructions = payload.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    given = payload.get("input")
    if isinstance(given, str):
        return [*messages, {"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise cfg_error("input: Field required (a string or a list of messages)", "input")
    for item in given:
        if not isinstance(item, dict) or not isinstance(item.get("role"), str):
            raise cfg_error("input: each item must be a message with a role", "input")
        content = item.get("content")
        if isinstance(content, list):
            texts = [p.get("text") for p in content if isinstance(p, dict)]
            content = "".join(t for t in texts if isinstance(t, str))
        messages.append({"role": item["role"], "content": content})
    return messages


async def responses(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    cfg = state.config
    dialect = state.dialect

    def bad(message: str, param: str | None) -> SimError:
        return dialect.error(cfg, 400, message, kind="BadRequestError", param=param)

    try:
        payload = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise dialect.invalid(cfg, f"JSON decode error: {exc}") from None
    if not isinstance(payload, dict):
        raise dialect.invalid(cfg, "Input should be a valid dictionary")
    for unsupported in ("tools", "previous_response_id"):
        if payload.get(unsupported):
            raise bad(f"the simulated upstream does not support `{unsupported}`", unsupported)
    model = dialect.check_model(cfg, payload.get("model"))
    messages = _messages(bad, payload)
    prompt = prompt_tokens(
        messages, add_generation_prompt=True, bytes_per_token=cfg.bytes_per_token
    )
    if prompt >= cfg.max_model_len:
        raise dialect.prompt_too_long(cfg, prompt)
    limit = payload.get("max_output_tokens")
    room = cfg.max_model_len - prompt
    if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
        room = min(room, limit)
    tokens = min(cfg.completion_tokens, room)
    incomplete = room <= cfg.completion_tokens  # as a chat answer's finish_reason length
    plan = Plan(model, prompt, tokens, "length" if incomplete else "stop")
    words = completion_text(tokens)
    rid, mid, created = rand_id("resp_"), rand_id("msg_"), int(time.time())

    def body(status: str, text: str, parts: bool = True) -> dict[str, Any]:
        item = {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": None}]
            if parts
            else [],
        }
        done = status != "in_progress"
        return {
            "id": rid,
            "object": "response",
            "created_at": created,
            "model": model,
            "status": ("incomplete" if incomplete else "completed") if done else status,
            "incomplete_details": {"reason": "max_output_tokens"} if done and incomplete else None,
            "instructions": payload.get("instructions"),
            "max_output_tokens": payload.get("max_output_tokens"),
            "output": [item] if done else [],
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": None,
            "temperature": payload.get("temperature"),
            "tool_choice": "auto",
            "tools": [],
            "top_p": payload.get("top_p"),
            "truncation": "disabled",
            "usage": {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + tokens,
            }
            if done
            else None,
            "user": None,
        }

    final = "incomplete" if incomplete else "completed"
    text = "".join(words).lstrip()

    def events() -> Iterator[bytes]:
        seq = iter(range(1 << 30))

        def event(kind: str, **fields: Any) -> bytes:
            data = {"type": kind, "sequence_number": next(seq), **fields}
            return f"event: {kind}\ndata: ".encode() + orjson.dumps(data) + b"\n\n"

        part: dict[str, Any] = {
            "type": "output_text",
            "text": "",
            "annotations": [],
            "logprobs": None,
        }
        yield b"".join(
            [
                event("response.created", response=body("in_progress", "")),
                event("response.in_progress", response=body("in_progress", "")),
                event(
                    "response.output_item.added",
                    output_index=0,
                    item={
                        "id": mid,
                        "type": "message",
                        "role": "assistant",
                        "status": "in_progress",
                        "content": [],
                    },
                ),
                event(
                    "response.content_part.added",
                    item_id=mid,
                    output_index=0,
                    content_index=0,
                    part=part,
                ),
            ]
        )
        for k, word in enumerate(words):
            delta = word.lstrip() if k == 0 else word
            yield event("response.output_text.delta", item_id=mid, output_index=0,
                        content_index=0, delta=delta, logprobs=[])  # fmt: skip
        item = body(final, text)["output"][0]
        yield b"".join(
            [
                event(
                    "response.output_text.done",
                    item_id=mid,
                    output_index=0,
                    content_index=0,
                    text=text,
                    logprobs=[],
                ),
                event(
                    "response.content_part.done",
                    item_id=mid,
                    output_index=0,
                    content_index=0,
                    part={**part, "text": text},
                ),
                event("response.output_item.done", output_index=0, item=item),
                event(f"response.{final}", response=body(final, text)),
            ]
        )

    stream = events() if payload.get("stream") else None
    return await generate(request, plan, stream, lambda: orjson.dumps(body(final, text)))
