"""FastChat 0.2.36's wire format: ``fastchat/serve/openai_api_server.py``
(``create_error_response``, ``check_length``, ``check_requests``,
``chat_completion_stream_generator``), ``fastchat/protocol/openai_api_protocol.py``
and ``fastchat/constants.py`` (``ErrorCode``).
"""

from __future__ import annotations

import json
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
    model_list,
)
from proxy.sim.tokenizer import prompt_tokens

# FastChat's ErrorCode (fastchat/constants.py).
FC_VALIDATION_TYPE_ERROR = 40001
FC_INVALID_MODEL = 40301
FC_PARAM_OUT_OF_RANGE = 40302
FC_CONTEXT_OVERFLOW = 40303
FC_INTERNAL_ERROR = 50001


class FastChat(Dialect):
    name = "fastchat"

    def error(
        self, cfg: SimConfig, status: int, message: str, *, kind: str = "", param: str | None = None
    ) -> SimError:
        # FastChat's create_error_response: always HTTP 400, the code in the body.
        code = {
            "invalid": FC_VALIDATION_TYPE_ERROR,
            "model": FC_INVALID_MODEL,
            "range": FC_PARAM_OUT_OF_RANGE,
            "context": FC_CONTEXT_OVERFLOW,
        }.get(kind, FC_INTERNAL_ERROR)
        return SimError(400, {"object": "error", "message": message, "code": code})

    def invalid(self, cfg: SimConfig, message: str) -> SimError:
        return self.error(
            cfg, 400, f"1 validation error for ChatCompletionRequest\n{message}", kind="invalid"
        )

    def check_model(self, cfg: SimConfig, model: Any) -> str:
        if not isinstance(model, str):
            raise self.invalid(cfg, "model\n  Field required")
        if model != cfg.model and cfg.strict_model:
            raise self.error(
                cfg, 400, f"Only {cfg.model} allowed now, your model {model}", kind="model"
            )
        return model

    def prompt_too_long(self, cfg: SimConfig, prompt: int) -> SimError:
        return self.error(
            cfg,
            400,
            f"This model's maximum context length is {cfg.max_model_len} tokens. "
            f"However, your messages resulted in {prompt} tokens. Please reduce the "
            "length of the messages.",
            kind="context",
        )

    def _render(self, cfg: SimConfig, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # FastChat keeps one system message (the last one given, else the template's
        # default) at the top, and knows only user and assistant besides.
        system = cfg.fastchat_system_message
        turns: list[dict[str, Any]] = []
        for message in messages:
            role = message.get("role")
            if role == "system":
                system = message.get("content") or ""
            elif role in ("user", "assistant"):
                turns.append(message)
            else:
                # get_gen_params raises ValueError(f"Unknown role: {role}") and nothing
                # catches it: Starlette answers a bare 500.
                raise SimError(500, "Internal Server Error")
        return [{"role": "system", "content": system}, *turns]

    def _check_params(self, cfg: SimConfig, payload: dict[str, Any]) -> None:
        def bad(message: str) -> SimError:
            return self.error(cfg, 400, message, kind="range")

        max_tokens, n = payload.get("max_tokens"), payload.get("n")
        temperature, top_p = payload.get("temperature"), payload.get("top_p")
        if isinstance(max_tokens, int) and max_tokens <= 0:
            raise bad(f"{max_tokens} is less than the minimum of 1 - 'max_tokens'")
        if isinstance(n, int) and n <= 0:
            raise bad(f"{n} is less than the minimum of 1 - 'n'")
        if isinstance(temperature, int | float) and temperature < 0:
            raise bad(f"{temperature} is less than the minimum of 0 - 'temperature'")
        if isinstance(temperature, int | float) and temperature > 2:
            raise bad(f"{temperature} is greater than the maximum of 2 - 'temperature'")
        if isinstance(top_p, int | float) and top_p < 0:
            raise bad(f"{top_p} is less than the minimum of 0 - 'top_p'")
        if isinstance(top_p, int | float) and top_p > 1:
            raise bad(f"{top_p} is greater than the maximum of 1 - 'top_p'")

    def plan_chat(self, cfg: SimConfig, payload: dict[str, Any]) -> Plan:
        messages = check_messages(self, cfg, payload)
        model = self.check_model(cfg, payload.get("model"))
        self._check_params(cfg, payload)
        prompt = prompt_tokens(
            self._render(cfg, messages),
            add_generation_prompt=True,
            bytes_per_token=cfg.bytes_per_token,
        )
        max_tokens = payload.get("max_tokens")
        if not isinstance(max_tokens, int) or max_tokens <= 0:
            max_tokens = 1024 * 1024  # check_length: "model worker not support None"
        room = min(max_tokens, cfg.max_model_len - prompt)
        if room <= 0:
            raise self.prompt_too_long(cfg, prompt)
        tokens = min(cfg.completion_tokens, room)
        finish = "length" if room <= cfg.completion_tokens else "stop"
        return Plan(model, prompt, tokens, finish)

    def chat_body(self, plan: Plan, rid: str, created: int) -> bytes:
        text = "".join(completion_text(plan.completion_tokens)).lstrip()
        return orjson.dumps(
            {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": plan.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": plan.finish_reason,
                    }
                ],
                "usage": {
                    "prompt_tokens": plan.prompt_tokens,
                    "total_tokens": plan.prompt_tokens + plan.completion_tokens,
                    "completion_tokens": plan.completion_tokens,
                },
            }
        )

    def chat_stream(
        self, plan: Plan, payload: dict[str, Any], rid: str, created: int
    ) -> Iterator[bytes]:
        # FastChat dumps with json.dumps (", " and ": " separators) and
        # exclude_unset, so chunks carry no "object"/"created" -- except the finish
        # chunk, dumped with exclude_none. No usage chunk, whatever stream_options say.
        def event(chunk: dict[str, Any]) -> bytes:
            return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode()

        yield event(
            {
                "id": rid,
                "model": plan.model,
                "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}],
            }
        )
        for word in completion_text(plan.completion_tokens):
            yield event(
                {
                    "id": rid,
                    "model": plan.model,
                    "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}],
                }
            )
        yield event(
            {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": plan.model,
                "choices": [{"index": 0, "delta": {}, "finish_reason": plan.finish_reason}],
            }
        )
        yield b"data: [DONE]\n\n"

    def models(self, cfg: SimConfig) -> dict[str, Any]:
        return model_list(cfg, "fastchat", search_indices=True)
