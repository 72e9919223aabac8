"""The dialects' conversion against vLLM's own code, run in the vLLM venv.

For every sample body (``samples.py``) and every kept set trimming can produce (the
head, optionally the first turn, then every suffix from a turn start), the chat
messages and tools ``to_chat``/``tools`` give equal what vLLM 0.32 builds from the
body ``render`` forwards. Skipped when the vLLM venv is absent (it is never built
here: ``scripts/vllm_env.sh`` or the engine tests build it).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.dialects import messages, responses
from proxy.dialects.conversation import Conversation
from proxy.dialects.messages_chat import chat_tools
from proxy.trimming import split_turns
from proxy.types import Message
from tests.dialects.samples import MESSAGES, RESPONSES
from tests.support.tiny_model import cache_root

pytestmark = pytest.mark.vllm

SCRIPT = Path(__file__).with_name("vllm_reference.py")
#: What vLLM's chat parsing reads of a message (proxy/tokens/hf/normalize.py).
READ = frozenset(("role", "content", "name", "tool_calls", "tool_call_id", "reasoning", "tools"))


def _python() -> Path:
    venv = os.environ.get("TRIMPROXY_VLLM_VENV")
    python = (Path(venv) if venv else cache_root() / "vllm-venv") / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"no vLLM venv at {python.parent.parent} (TRIMPROXY_VLLM_VENV)")
    return python


def _reference(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(_python()), str(SCRIPT)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results: list[dict[str, Any]] = json.loads(done.stdout)
    return results


def _kept_sets(conv: Conversation) -> Iterator[list[int]]:
    """Every kept set trimming can choose: head + (first turn) + a suffix from a turn."""
    turns = split_turns(conv.roles)
    n = len(conv.items)
    head = list(range(turns.head))
    starts = list(turns.starts)
    for k, start in enumerate(starts):
        yield [*head, *range(start, n)]
        if k > 1:
            yield [*head, *range(starts[0], starts[1]), *range(start, n)]


def _seen(chat: list[Message]) -> list[Message]:
    return [{k: v for k, v in m.items() if k in READ} for m in chat]


Expected = tuple[dict[str, Any], list[Message], Any]


def _responses_cases() -> Iterator[Expected]:
    for body in RESPONSES:
        conv = responses.parse(orjson.dumps(body))
        for kept in _kept_sets(conv):
            forwarded = orjson.loads(responses.render(conv, kept, None))
            chat, owner = responses.to_chat(conv, kept)
            assert owner == sorted(owner) and set(owner) <= set(kept)
            yield {"dialect": "responses", "body": forwarded}, chat, conv.tools


def _messages_cases(merge: bool) -> Iterator[Expected]:
    for body in MESSAGES:
        conv = messages.parse(orjson.dumps(body))
        for kept in _kept_sets(conv):
            forwarded = orjson.loads(messages.render(conv, kept, None))
            chat, owner = messages.to_chat(conv, kept, merge_inline_system=merge)
            assert owner == sorted(owner) and set(owner) <= set(kept)
            case = {"dialect": "messages", "body": forwarded, "merge": merge}
            yield case, chat, chat_tools(conv, kept)


def test_conversions_equal_vllms_own() -> None:
    """One run of the vLLM venv (its imports take seconds) for every case."""
    expected = [*_responses_cases(), *_messages_cases(False), *_messages_cases(True)]
    assert len(expected) > 2 * len(MESSAGES) + len(RESPONSES)
    results = _reference([case for case, _, _ in expected])
    for (case, chat, tools), result in zip(expected, results, strict=True):
        assert "error" not in result, (case, result)
        assert _seen(chat) == _seen(result["messages"]), case
        assert tools == result["tools"], case
