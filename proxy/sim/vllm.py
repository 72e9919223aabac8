"""vLLM's wire format (``vllm/entrypoints/openai``): ``engine/protocol.py``
(ErrorResponse/ErrorInfo, ModelCard), ``engine/serving.py`` (``_validate_input``,
``create_error_response``), ``chat_completion/serving.py`` (the stream generator:
``exclude_unset`` chunks, ``"usage": null`` on each when usage is asked for, a final
``choices: []`` usage chunk).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

from proxy.sim.config import SimConfig
from proxy.sim.dialect import (
    Dialect,
    Plan,
    SimError,
    check_messages,
    completion_text,
    continued_tokens,
    max_tokens_of,
    model_list,
)
from proxy.sim.options import ToolCall, logprobs_of, parse_options, pieces, tool_call_id
from proxy.sim.tokenizer import prompt_ids, prompt_tokens


def _tokens(plan: Plan) -> list[str]:
    """The generated tokens of each choice: the sim's words, or the JSON content of a
    response format or tool call cut into as many pieces."""
    options = plan.options
    if options.tool_call is not None:
        return pieces(options.tool_call.arguments, plan.completion_tokens)
    if options.content is not None:
        return pieces(options.content, plan.completion_tokens)
    return completion_text(plan.skip + plan.completion_tokens)[plan.skip :]


def _call(call: ToolCall, arguments: str | None = None) -> dict[str, Any]:
    return {
        "id": tool_call_id(),
        "type": "function",
        "function": {
            "name": call.name,
            "arguments": call.arguments if arguments is None else arguments,
        },
    }


class VLLM(Dialect):
    name = "vllm"

    def error(
        self, cfg: SimConfig, status: int, message: str, *, kind: str, param: str | None = None
    ) -> SimError:
        if cfg.error_style == "legacy":
            # vLLM before the ErrorInfo envelope: flat, with "object": "error".
            return SimError(
                status,
                {
                    "object": "error",
                    "message": message,
                    "type": kind,
                    "param": param,
                    "code": status,
                },
            )
        return SimError(
            status, {"error": {"message": message, "type": kind, "param": param, "code": status}}
        )

    def invalid(self, cfg: SimConfig, message: str) -> SimError:
        # FastAPI's RequestValidationError handler in vLLM's api_server: type is the
        # status phrase there, not an exception name.
        return self.error(cfg, 400, message, kind="Bad Request")

    def check_model(self, cfg: SimConfig, model: Any) -> str:
        if model is None or model == cfg.model or not cfg.strict_model:
            return model if isinstance(model, str) and model else cfg.model
        raise self.error(
            cfg, 404, f"The model `{model}` does not exist.", kind="NotFoundError", param="model"
        )

    def prompt_too_long(self, cfg: SimConfig, prompt: int) -> SimError:
        limit = cfg.max_model_len
        if cfg.error_style == "legacy":
            return self.error(
                cfg,
                400,
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {prompt} tokens in the messages, Please reduce the length "
                "of the messages.",
                kind="BadRequestError",
            )
        return self.error(
            cfg,
            400,
            f"This model's maximum context length is {limit} tokens. However, your "
            f"request has {prompt} input tokens. Please reduce the length of the "
            "input messages.",
            kind="BadRequestError",
            param="input_tokens",
        )

    def _context_error(self, cfg: SimConfig, prompt: int, max_tokens: int | None) -> None:
        limit = cfg.max_model_len
        if cfg.error_style == "legacy":
            if max_tokens is None and prompt >= limit:
                raise self.prompt_too_long(cfg, prompt)
            if max_tokens is not None and prompt + max_tokens > limit:
                message = (
                    f"This model's maximum context length is {limit} tokens. However, you "
                    f"requested {prompt + max_tokens} tokens ({prompt} in the messages, "
                    f"{max_tokens} in the completion). Please reduce the length of the "
                    "messages or completion."
                )
            else:
                return
            raise self.error(cfg, 400, message, kind="BadRequestError")
        if prompt >= limit:
            raise self.prompt_too_long(cfg, prompt)
        if max_tokens is not None and prompt + max_tokens > limit:
            raise self.error(
                cfg,
                400,
                "'max_tokens' or 'max_completion_tokens' is too large: "
                f"{max_tokens}. This model's maximum context length is {limit} tokens "
                f"and your request has {prompt} input tokens ({max_tokens} > {limit} "
                f"- {prompt}).",
                kind="BadRequestError",
                param="max_tokens",
            )

    def plan_chat(self, cfg: SimConfig, payload: dict[str, Any]) -> Plan:
        messages = check_messages(self, cfg, payload)
        model = self.check_model(cfg, payload.get("model"))
        for message in messages:
            # vLLM takes any role string (custom roles exist); the template decides.
            if not isinstance(message.get("role"), str):
                raise self.invalid(cfg, "messages: each message needs a role")
        skip = continued_tokens(self, cfg, payload)
        max_tokens = max_tokens_of(payload)
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise self.invalid(cfg, "max_tokens: Input should be greater than or equal to 1")
        ids = None
        if cfg.prefix_caching:
            ids = prompt_ids(
                messages, add_generation_prompt=skip is None, bytes_per_token=cfg.bytes_per_token
            )
            prompt = len(ids)
        else:
            prompt = prompt_tokens(
                messages, add_generation_prompt=skip is None, bytes_per_token=cfg.bytes_per_token
            )
        self._context_error(cfg, prompt, max_tokens)
        room = max_tokens if max_tokens is not None else cfg.max_model_len - prompt
        left = max(cfg.completion_tokens - (skip or 0), 0)
        tokens = min(left, room)
        finish = "length" if room <= left else "stop"
        options = parse_options(
            payload,
            lambda message, param: self.error(
                cfg, 400, message, kind="BadRequestError", param=param
            ),
        )
        plan = Plan(model, prompt, tokens, finish, options, ids, skip=skip or 0)
        if ids is not None and options.n == 1 and options.tool_call is None:
            plan.answer = "".join(_tokens(plan)).lstrip()
        return plan

    def chat_body(self, plan: Plan, rid: str, created: int) -> bytes:
        options = plan.options
        tokens = _tokens(plan)
        choices = []
        for index in range(options.n):
            call = options.tool_call
            message: dict[str, Any] = {
                "role": "assistant",
                "content": "" if call else "".join(tokens).lstrip(),
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "tool_calls": [_call(call)] if call else [],
                "reasoning_content": None,
            }
            choices.append(
                {
                    "index": index,
                    "message": message,
                    "logprobs": logprobs_of(tokens, options.top_logprobs)
                    if options.logprobs
                    else None,
                    "finish_reason": plan.finish_reason,
                    "stop_reason": None,
                }
            )
        completion = plan.completion_tokens * options.n
        return orjson.dumps(
            {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": plan.model,
                "choices": choices,
                "service_tier": None,
                "system_fingerprint": None,
                "usage": {
                    "prompt_tokens": plan.prompt_tokens,
                    "total_tokens": plan.prompt_tokens + completion,
                    "completion_tokens": completion,
                    "prompt_tokens_details": None,
                },
                "prompt_logprobs": None,
                "kv_transfer_params": None,
            }
        )

    def chat_stream(
        self, plan: Plan, payload: dict[str, Any], rid: str, created: int
    ) -> Iterator[bytes]:
        options = payload.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        n = plan.options.n
        call = plan.options.tool_call
        head = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": plan.model,
        }

        def event(choice: dict[str, Any]) -> bytes:
            chunk: dict[str, Any] = {**head, "choices": [choice]}
            if include_usage:
                chunk["usage"] = None  # vLLM sets it explicitly on every chunk
            return b"data: " + orjson.dumps(chunk) + b"\n\n"

        # One yield per generated token (the server paces them); with n choices it
        # holds one event per choice, as vLLM sends them.
        yield b"".join(
            event(
                {
                    "index": i,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            )
            for i in range(n)
        )
        tokens = _tokens(plan) or [""]
        for k, token in enumerate(tokens):
            last = k == len(tokens) - 1
            if call is None:
                delta: dict[str, Any] = {"content": token}
            elif k == 0:
                delta = {"tool_calls": [{**_call(call, token), "index": 0}]}
            else:
                delta = {"tool_calls": [{"index": 0, "function": {"arguments": token}}]}
            step = []
            for i in range(n):
                choice: dict[str, Any] = {
                    "index": i,
                    "delta": delta,
                    "logprobs": logprobs_of([token], plan.options.top_logprobs)
                    if plan.options.logprobs
                    else None,
                    "finish_reason": plan.finish_reason if last else None,
                }
                if last:
                    choice["stop_reason"] = None
                step.append(event(choice))
            yield b"".join(step)
        if include_usage:
            completion = plan.completion_tokens * n
            usage = {
                "prompt_tokens": plan.prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": plan.prompt_tokens + completion,
            }
            yield b"data: " + orjson.dumps({**head, "choices": [], "usage": usage}) + b"\n\n"
        yield b"data: [DONE]\n\n"

    def models(self, cfg: SimConfig) -> dict[str, Any]:
        return model_list(cfg, "vllm", search_indices=False, max_model_len=cfg.max_model_len)
