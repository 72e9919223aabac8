"""What the two servers the sim plays have in common: the ``Dialect`` base, the plan
of one generation, the error answer. Each one's wire format is in ``vllm.py`` and
``fastchat.py``; the state picks one by name (``state.dialect_for``). Everything here
builds plain dicts and bytes; no I/O.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from proxy.sim.config import SimConfig
from proxy.sim.options import ChatOptions

_WORDS = (" Hello", " from", " the", " simulated", " upstream", ".")


class SimError(Exception):
    """An error answer: status, and the body the real server would send."""

    def __init__(self, status: int, body: dict[str, Any] | str) -> None:
        super().__init__(status)
        self.status = status
        self.body = body


def completion_text(tokens: int) -> list[str]:
    """The generated tokens, one string each (deterministic)."""
    return [_WORDS[i % len(_WORDS)] for i in range(tokens)]


def rand_id(prefix: str) -> str:
    return f"{prefix}{os.urandom(12).hex()}"


@dataclass(slots=True)
class Plan:
    """What one generation request will produce."""

    model: str
    prompt_tokens: int
    completion_tokens: int
    """Per choice: each of the ``options.n`` choices generates this many."""
    finish_reason: str
    options: ChatOptions = field(default_factory=ChatOptions)
    #: The prompt's token ids, when the prefix cache needs them.
    prompt_ids: list[int] | None = None
    #: The assistant message the answer becomes in the next turn's prompt (one
    #: plain-text choice only), so its blocks can be cached as vLLM caches them.
    answer: str | None = None
    #: The prompt tokens found in the prefix cache, known once the request is admitted
    #: (``generation.generate`` sets it): the Responses API reports them as usage.
    cached_tokens: int = 0
    #: The sim's tokens already in the assistant message it continues
    #: (``continue_final_message``): the answer goes on from there.
    skip: int = 0


class Dialect:
    name: str = ""

    # -- errors ---------------------------------------------------------------
    def error(
        self, cfg: SimConfig, status: int, message: str, *, kind: str, param: str | None = None
    ) -> SimError:
        raise NotImplementedError

    def invalid(self, cfg: SimConfig, message: str) -> SimError:
        """A request body the server's validation refuses."""
        raise NotImplementedError

    def check_model(self, cfg: SimConfig, model: Any) -> str:
        raise NotImplementedError

    def prompt_too_long(self, cfg: SimConfig, prompt: int) -> SimError:
        """The error for a prompt that alone fills the context window."""
        raise NotImplementedError

    # -- chat ----------------------------------------------------------------
    def plan_chat(self, cfg: SimConfig, payload: dict[str, Any]) -> Plan:
        raise NotImplementedError

    def chat_body(self, plan: Plan, rid: str, created: int) -> bytes:
        raise NotImplementedError

    def chat_stream(
        self, plan: Plan, payload: dict[str, Any], rid: str, created: int
    ) -> Iterator[bytes]:
        """SSE events, one per yield; ``len(tokens) + k`` of them, ``[DONE]`` last.

        The server paces the yields after the first one, one generated token each,
        so callers get: role chunk, one chunk per token, then the tail.
        """
        raise NotImplementedError

    def models(self, cfg: SimConfig) -> dict[str, Any]:
        raise NotImplementedError


def max_tokens_of(payload: dict[str, Any]) -> Any:
    value = payload.get("max_completion_tokens")
    return value if value else payload.get("max_tokens")


def check_messages(dialect: Dialect, cfg: SimConfig, payload: Any) -> list[dict[str, Any]]:
    if not isinstance(payload, dict):
        raise dialect.invalid(cfg, "Input should be a valid dictionary")
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise dialect.invalid(cfg, "messages: Field required (a non-empty list)")
    if not all(isinstance(m, dict) for m in messages):
        raise dialect.invalid(cfg, "messages: Input should be a valid dictionary")
    return messages


def continued_tokens(dialect: Dialect, cfg: SimConfig, payload: dict[str, Any]) -> int | None:
    """With ``continue_final_message``: how many of the sim's tokens the final assistant
    message holds (its text is where the deterministic answer goes on); None without.
    vLLM's own checks: not with ``add_generation_prompt``, and the last message an
    assistant's."""
    if not payload.get("continue_final_message"):
        return None
    if payload.get("add_generation_prompt", True):
        raise dialect.invalid(
            cfg, "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
        )
    last = payload["messages"][-1]
    text = last.get("content") if last.get("role") == "assistant" else None
    if not isinstance(text, str):
        raise dialect.invalid(cfg, "continue_final_message: the last message is not an assistant's")
    return words_in(text)


def words_in(text: str, stripped: bool = False) -> int:
    """How many of the sim's words ``text`` holds, the answer so far (0 when it is not
    the start of the sim's answer); ``stripped``: the first word without its leading
    space, as the Responses route writes it."""
    done, count = "", 0
    while len(done.lstrip() if stripped else done) < len(text):
        done += _WORDS[count % len(_WORDS)]
        count += 1
    return count if (done.lstrip() if stripped else done) == text else 0


def new_chat_id() -> str:
    return rand_id("chatcmpl-")


def model_list(
    cfg: SimConfig, owned_by: str, *, search_indices: bool, **own: Any
) -> dict[str, Any]:
    """``GET /v1/models``: the one model in the OpenAI shape both servers answer with;
    ``own`` adds a server's own fields (vLLM's ``max_model_len``)."""
    created = int(time.time())
    permission = {
        "id": rand_id("modelperm-"),
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": search_indices,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    model = {
        "id": cfg.model,
        "object": "model",
        "created": created,
        "owned_by": owned_by,
        "root": cfg.model,
        "parent": None,
        **own,
        "permission": [permission],
    }
    return {"object": "list", "data": [model]}
