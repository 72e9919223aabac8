"""A vLLM engine for coding agents' requests, and a coding agent's request.

The session engine's template mirrors FastChat's: it renders no tools and refuses a
``tool`` message. ``agent_stack(folder, window)`` serves the same weights with a
ChatML template that renders tools and tool messages (as Qwen's and Hermes' do), the
given window (its KV cache holds 2,048 tokens more), and vLLM's auto tool choice on
(``--enable-auto-tool-choice --tool-call-parser hermes``), which a Messages request
with tools needs. ``agent_tools``/``agent_history`` build a coding agent's tools and
history; ``AgentProxies`` starts trimproxy processes in front of such an engine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.support.dialect_clients import prose
from tests.support.processes import ProxyProcess
from tests.support.tiny_model import MODEL_NAME
from tests.support.vllm_stack import VllmStack, build_vllm_model

#: ChatML with tools, as Qwen's and Hermes' templates render them: the tools in the
#: system message, calls in the assistant message, results as ``tool`` messages.
AGENT_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set system = 'You are a helpful assistant.' -%}"
    "{%- set rest = messages -%}{%- endif -%}"
    "{{- '<|im_start|>system\\n' + system -}}"
    "{%- if tools -%}{{- '\\n\\n# Tools\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>' -}}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for message in rest -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}{%- endif -%}"
    "{%- for call in message.get('tool_calls') or [] -%}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' -}}"
    "{{- call['function']['arguments'] | tojson -}}{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

#: A coding agent's tool count, and its system prompt's size in bytes.
AGENT_TOOLS = 24
AGENT_SYSTEM_BYTES = 75 * 1024


def agent_model(folder: Path, window: int) -> Path:
    """The session model's weights with the agent template and ``window`` positions."""
    source = build_vllm_model()
    target = folder / MODEL_NAME
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    config["max_position_embeddings"] = window
    (target / "config.json").write_text(json.dumps(config))
    tokenizer = json.loads((target / "tokenizer_config.json").read_text())
    tokenizer.update(chat_template=AGENT_TEMPLATE, model_max_length=window)
    (target / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return target


def agent_stack(folder: Path, window: int, **options: Any) -> VllmStack:
    """An engine (not started) serving ``agent_model`` with a ``window`` of its own."""
    return VllmStack(
        agent_model(folder, window),
        max_model_len=window,
        kv_blocks=(window + 2048) // 32,
        extra_args=("--enable-auto-tool-choice", "--tool-call-parser", "hermes"),
        **options,
    )


def agent_system() -> str:
    """A coding agent's system prompt: 75 kB of prose."""
    return prose(75, 16_000)[:AGENT_SYSTEM_BYTES]


def agent_tools() -> list[dict[str, Any]]:
    """24 tools in Anthropic's shape. Their descriptions are shorter than a real
    agent's: their JSON alone costs the tiny tokenizer ~200 tokens a tool."""
    return [
        {
            "name": f"tool_{i}",
            "description": f"Tool {i}: {prose(500 + i, 12)}.",
            "input_schema": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": prose(600 + i, 4)},
                    "limit": {"type": "integer", "description": prose(700 + i, 4)},
                },
                "required": ["path"],
            },
        }
        for i in range(AGENT_TOOLS)
    ]


def agent_history(turns: int) -> list[dict[str, Any]]:
    """``turns`` steps of user and assistant, then the next user message."""
    history: list[dict[str, Any]] = []
    for t in range(1, turns + 1):
        history += [
            {"role": "user", "content": f"Step {t}: {prose(800 + t, 60)}"},
            {"role": "assistant", "content": f"Done {t}: {prose(900 + t, 40)}."},
        ]
    return [*history, {"role": "user", "content": "Next step, please."}]


class AgentProxies:
    """``start(**settings)``: a trimproxy process in front of ``engine`` (its key, the
    hf counter on its model); ``stop_all()`` when the test ends."""

    def __init__(self, engine: VllmStack) -> None:
        self.engine = engine
        self.started: list[ProxyProcess] = []

    def start(self, **settings: Any) -> ProxyProcess:
        merged = {
            "upstream_url": self.engine.base_url,
            "upstream_api_key": self.engine.api_key,
            "tokenizer": f"hf:{self.engine.model_dir}",
            **settings,
        }
        proxy = ProxyProcess(settings=merged, startup_timeout=120.0)
        self.started.append(proxy)
        return proxy.start()

    def stop_all(self) -> None:
        for proxy in self.started:
            proxy.stop()
