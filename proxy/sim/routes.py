"""The model server's routes: what a client of vLLM or FastChat talks to."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import orjson
from aiohttp import web

from proxy.sim.dialect import Plan, SimError, completion_text, new_chat_id
from proxy.sim.generation import JSON_TYPE, generate
from proxy.sim.metrics import render_metrics
from proxy.sim.state import STATE, SimState
from proxy.sim.tokenizer import prompt_ids, raw_prompt_ids, raw_prompt_tokens


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type=JSON_TYPE)


def error_response(exc: SimError) -> web.Response:
    if isinstance(exc.body, str):
        return web.Response(text=exc.body, status=exc.status, content_type="text/plain")
    return json_response(exc.body, exc.status)


async def read_json(request: web.Request, state: SimState) -> dict[str, Any]:
    try:
        payload = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise state.dialect.invalid(state.config, f"JSON decode error: {exc}") from None
    if not isinstance(payload, dict):
        raise state.dialect.invalid(state.config, "Input should be a valid dictionary")
    return payload


def _strings(state: SimState, value: Any, field: str) -> list[str]:
    """``value`` as a non-empty list of strings (a bare string is a list of one)."""
    items = value if isinstance(value, list) else [value]
    texts = [item for item in items if isinstance(item, str)]
    if not texts or len(texts) != len(items):
        raise state.dialect.invalid(state.config, f"{field}: Input should be a valid string")
    return texts


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    payload = await read_json(request, state)
    dialect = state.dialect
    plan = dialect.plan_chat(state.config, payload)
    rid, created = new_chat_id(), int(time.time())
    events = dialect.chat_stream(plan, payload, rid, created) if payload.get("stream") else None
    return await generate(request, plan, events, lambda: dialect.chat_body(plan, rid, created))


async def completions(request: web.Request) -> web.StreamResponse:
    """Legacy completions, minimal, with the same pacing and KV accounting as chat."""
    state = request.app[STATE]
    cfg = state.config
    payload = await read_json(request, state)
    lengths = _prompt_lengths(state, payload.get("prompt"))
    model = state.dialect.check_model(cfg, payload.get("model"))
    # Each prompt is a request of its own to vLLM, checked against the window alone;
    # usage.prompt_tokens is their sum.
    count = sum(lengths)
    room = cfg.max_model_len - max(lengths)
    if room <= 0:
        raise state.dialect.prompt_too_long(cfg, max(lengths))
    # vLLM's (and FastChat's) CompletionRequest.max_tokens defaults to 16.
    max_tokens = payload.get("max_tokens", 16)
    max_tokens = 16 if max_tokens is None else max_tokens
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
        raise state.dialect.invalid(cfg, "max_tokens: Input should be greater than or equal to 0")
    room = min(room, max_tokens)
    tokens = min(cfg.completion_tokens, room)
    plan = Plan(model, count, tokens, "length" if room <= cfg.completion_tokens else "stop")
    rid, created = f"cmpl-{new_chat_id()[9:]}", int(time.time())
    words = completion_text(tokens)

    def chunk(text: str, finish: str | None) -> dict[str, Any]:
        return {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
        }

    def body() -> bytes:
        out = chunk("".join(words), plan.finish_reason)
        out["usage"] = {
            "prompt_tokens": count,
            "total_tokens": count + tokens,
            "completion_tokens": tokens,
        }
        return orjson.dumps(out)

    def events() -> Iterator[bytes]:
        # vLLM sends no opening chunk on completions: one chunk per token. (``generate``
        # writes the first event at once; an empty one writes nothing.)
        yield b""
        for i, word in enumerate(words):
            finish = plan.finish_reason if i == len(words) - 1 else None
            yield b"data: " + orjson.dumps(chunk(word, finish)) + b"\n\n"
        yield b"data: [DONE]\n\n"

    return await generate(request, plan, events() if payload.get("stream") else None, body)


def _prompt_lengths(state: SimState, value: Any) -> list[int]:
    """Each prompt's tokens: text (a string or a list of them) by the sim's tokenizer,
    token ids (a list, or a list of lists) as they are, as vLLM reads ``prompt``."""
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        return [len(ids) for ids in value]
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return [len(value)]
    bytes_per_token = state.config.bytes_per_token
    return [raw_prompt_tokens(p, bytes_per_token) for p in _strings(state, value, "prompt")]


async def embeddings(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    cfg = state.config
    payload = await read_json(request, state)
    inputs = _strings(state, payload.get("input"), "input")
    model = state.dialect.check_model(cfg, payload.get("model"))
    count = sum(raw_prompt_tokens(i, cfg.bytes_per_token) for i in inputs)
    # A deterministic 8-dimensional vector per input: enough to pass through.
    data = [
        {
            "object": "embedding",
            "embedding": [((len(text) * (k + 1)) % 97) / 97 for k in range(8)],
            "index": n,
        }
        for n, text in enumerate(inputs)
    ]
    return json_response(
        {
            "id": f"embd-{new_chat_id()[9:]}",
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": data,
            "usage": {"prompt_tokens": count, "total_tokens": count, "completion_tokens": 0},
        }
    )


async def models(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    return json_response(state.dialect.models(state.config))


async def not_found(request: web.Request) -> web.StreamResponse:
    """A route FastChat's server (a FastAPI app) does not have: FastAPI's 404 body."""
    return json_response({"detail": "Not Found"}, 404)


async def health(request: web.Request) -> web.StreamResponse:
    return web.Response()


async def metrics(request: web.Request) -> web.StreamResponse:
    return web.Response(
        text=render_metrics(request.app[STATE]), content_type="text/plain", charset="utf-8"
    )


async def reset_prefix_cache(request: web.Request) -> web.StreamResponse:
    """vLLM's dev-mode ``POST /reset_prefix_cache``: forget every cached block.
    ``{"success": false}`` while blocks are held by running requests, as vLLM says."""
    return json_response({"success": request.app[STATE].kv.reset_prefix_cache()})


async def tokenize(request: web.Request) -> web.StreamResponse:
    """vLLM ``POST /tokenize``: a chat (``messages``) or a plain ``prompt``."""
    state = request.app[STATE]
    cfg = state.config
    payload = await read_json(request, state)
    state.dialect.check_model(cfg, payload.get("model"))
    messages = payload.get("messages")
    if isinstance(messages, list):
        chat = [m for m in messages if isinstance(m, dict)]
        if len(chat) != len(messages):
            raise state.dialect.invalid(cfg, "messages: Input should be a valid dictionary")
        generation_prompt = payload.get("add_generation_prompt", True) is not False
        ids = prompt_ids(
            chat, add_generation_prompt=generation_prompt, bytes_per_token=cfg.bytes_per_token
        )
    elif isinstance(payload.get("prompt"), str):
        ids = raw_prompt_ids(payload["prompt"], cfg.bytes_per_token)
    else:
        raise state.dialect.invalid(cfg, "either messages or prompt is required")
    return json_response(
        {"count": len(ids), "max_model_len": cfg.max_model_len, "tokens": ids, "token_strs": None}
    )


async def token_check(request: web.Request) -> web.StreamResponse:
    """FastChat ``POST /api/v1/token_check``: counts raw prompt strings, no template."""
    state = request.app[STATE]
    cfg = state.config
    payload = await read_json(request, state)
    items = payload.get("prompts")
    if not isinstance(items, list):
        raise state.dialect.invalid(cfg, "prompts\n  Field required")
    out = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            raise state.dialect.invalid(cfg, "prompts: model, prompt and max_tokens required")
        state.dialect.check_model(cfg, item.get("model"))
        count = raw_prompt_tokens(item["prompt"], cfg.bytes_per_token)
        max_tokens = item.get("max_tokens")
        reserve = max_tokens if isinstance(max_tokens, int) else 0
        out.append(
            {
                "fits": count + reserve <= cfg.max_model_len,
                "tokenCount": count,
                "contextLength": cfg.max_model_len,
            }
        )
    return json_response({"prompts": out})
