"""The proxy's CPU per request in each dialect, on the same agent-shaped conversation.

One conversation as a coding agent sends it (a long system prompt, 24 tools, 30 turns
of user message, tool call, tool result and answer, then a new question: 40-80 kB) is
written three ways: a chat completion, a Responses request (``instructions``,
``function_call``/``function_call_output`` items, ``store: false``) and a Messages
request (``system``, ``tool_use``/``tool_result`` blocks); each with the tool choice
``none`` (the simulator, like vLLM, refuses ``auto`` without a tool parser). One trimproxy counting
with ``hf:`` (the test suite's tiny ChatML tokenizer, with a chat template that lists
the tools) serves all three in front of the simulator; each is sent ``--warmup``
times first, so the counters' caches are warm, as they are for an agent resending its
history. Then ``--rounds`` rounds of ``--requests`` requests of each dialect in turn
(so a load change on the machine falls on all three alike); the proxy process's CPU
time (utime + stime, from /proc) over each dialect's requests, per request, and its
ratio to chat's. The three bodies render to the same chat messages, so the proxy
counts the same prompt tokens for each (the table shows the count it forwarded).

    .venv/bin/python bench/dialects.py                     # ~1 min
    .venv/bin/python bench/dialects.py --turns 30 --requests 40 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import overhead  # noqa: E402

PATHS = {
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}
MODEL = "sim-model"
MAX_TOKENS = 64
#: Large enough that nothing is trimmed: the bench measures the whole path, not a cut.
WINDOW = 1_000_000
_PROSE = (
    "the agent reads the repository runs the tests and edits one file at a time keeping "
    "every change small and explaining why each step is needed before it moves on to "
    "the next function module or failing case in the build log"
)


def _text(rng: random.Random, size: int) -> str:
    vocabulary = _PROSE.split()
    words: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(vocabulary)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)


@dataclass(frozen=True)
class Turn:
    question: str
    tool: str
    arguments: dict[str, Any]
    result: str
    answer: str


@dataclass(frozen=True)
class Agent:
    """One agent's conversation, in no dialect yet."""

    system: str
    tools: list[dict[str, Any]]
    """name, description, parameters (a JSON schema)."""
    turns: list[Turn]
    question: str


def agent(turns: int = 30, tools: int = 24, system_bytes: int = 14_000, seed: int = 7) -> Agent:
    rng = random.Random(seed)
    declared = [
        {
            "name": f"tool_{i}",
            "description": _text(rng, 240),
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": _text(rng, 60)},
                    "pattern": {"type": "string", "description": _text(rng, 60)},
                    "limit": {"type": "integer", "description": _text(rng, 40)},
                },
                "required": ["path"],
            },
        }
        for i in range(tools)
    ]
    history = [
        Turn(
            question=_text(rng, 300),
            tool=f"tool_{rng.randrange(tools)}",
            arguments={"path": f"src/module_{n}.py", "pattern": rng.choice(_PROSE.split())},
            result=_text(rng, 600),
            answer=_text(rng, 300),
        )
        for n in range(turns)
    ]
    return Agent(_text(rng, system_bytes), declared, history, _text(rng, 300))


def chat_body(a: Agent) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": a.system}]
    for n, t in enumerate(a.turns):
        call = {
            "id": f"call_{n}",
            "type": "function",
            "function": {"name": t.tool, "arguments": json.dumps(t.arguments)},
        }
        messages += [
            {"role": "user", "content": t.question},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{n}", "content": t.result},
            {"role": "assistant", "content": t.answer},
        ]
    messages.append({"role": "user", "content": a.question})
    tools = [{"type": "function", "function": tool} for tool in a.tools]
    return {
        "model": MODEL,
        "messages": messages,
        "tools": tools,
        "tool_choice": "none",
        "max_tokens": MAX_TOKENS,
    }


def responses_body(a: Agent) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for n, t in enumerate(a.turns):
        items += [
            {"type": "message", "role": "user", "content": t.question},
            {
                "type": "function_call",
                "call_id": f"call_{n}",
                "name": t.tool,
                "arguments": json.dumps(t.arguments),
            },
            {"type": "function_call_output", "call_id": f"call_{n}", "output": t.result},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": t.answer}],
            },
        ]
    items.append({"type": "message", "role": "user", "content": a.question})
    return {
        "model": MODEL,
        "instructions": a.system,
        "input": items,
        "tools": [{"type": "function", **tool} for tool in a.tools],
        "tool_choice": "none",
        "max_output_tokens": MAX_TOKENS,
        "store": False,
    }


def messages_body(a: Agent) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for n, t in enumerate(a.turns):
        use = {"type": "tool_use", "id": f"call_{n}", "name": t.tool, "input": t.arguments}
        result = {"type": "tool_result", "tool_use_id": f"call_{n}", "content": t.result}
        messages += [
            {"role": "user", "content": t.question},
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
            {"role": "assistant", "content": t.answer},
        ]
    messages.append({"role": "user", "content": a.question})
    tools = [
        {"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
        for t in a.tools
    ]
    return {
        "model": MODEL,
        "system": a.system,
        "messages": messages,
        "tools": tools,
        "tool_choice": {"type": "none"},
        "max_tokens": MAX_TOKENS,
    }


def bodies(a: Agent) -> dict[str, bytes]:
    """The conversation in each dialect, keyed as ``PATHS``."""
    built = {"chat": chat_body(a), "responses": responses_body(a), "messages": messages_body(a)}
    return {name: json.dumps(body).encode() for name, body in built.items()}


def tokenizer_dir(workdir: Path) -> Path:
    """The tiny ChatML tokenizer with a template that lists the tools (tests/tokens)."""
    from tests.support.tiny_model import build_tokenizer
    from tests.tokens.templates import TEMPLATES

    dest = build_tokenizer(workdir / "tokenizer")
    config_path = dest / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = TEMPLATES["tools_default_system"]
    config_path.write_text(json.dumps(config))
    return dest


def start_sim(workdir: Path) -> overhead.Server:
    """The simulator of ``bench/overhead.py`` with a window no body here fills."""
    context = overhead.CONTEXT
    overhead.CONTEXT = WINDOW
    try:
        return overhead.start_sim(workdir)
    finally:
        overhead.CONTEXT = context


def start_proxy(sim: overhead.Server, workdir: Path, tokenizer: str) -> overhead.Server:
    port = overhead._free_port()
    env = overhead._env(
        {
            "TRIMPROXY_UPSTREAM_URL": sim.url,
            "TRIMPROXY_TOKENIZER": tokenizer,
            "TRIMPROXY_CONTEXT_WINDOW": str(WINDOW),
            "TRIMPROXY_UPSTREAM_METRICS_INTERVAL": "0",
            "TRIMPROXY_MAX_BODY_BYTES": str(8 << 20),
        }
    )
    args = [sys.executable, "-m", "proxy.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    server = overhead._spawn("trimproxy", args, workdir, env)
    server.url = f"http://127.0.0.1:{port}"
    overhead._wait_http(server, "/healthz", 60.0)
    return server


async def send(url: str, body: bytes, count: int, concurrency: int) -> set[str]:
    """``count`` requests of ``body`` to ``url``; the prompt counts the proxy forwarded
    (``X-Trimproxy-Prompt-Tokens``). Anything but 200 stops the run."""
    import aiohttp

    slots = asyncio.Semaphore(concurrency)
    counts: set[str] = set()
    headers = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:

        async def one() -> None:
            async with slots, s.post(url, data=body, headers=headers) as response:
                text = await response.read()
                if response.status != 200:
                    raise SystemExit(f"{url} answered {response.status}: {text[:300]!r}")
                counts.add(response.headers.get("x-trimproxy-prompt-tokens", "?"))

        await asyncio.gather(*(one() for _ in range(count)))
    return counts


@dataclass
class Row:
    endpoint: str
    body_bytes: int
    prompt_tokens: str
    cpu_s: float = 0.0
    requests: int = 0

    @property
    def ms_per_request(self) -> float:
        return self.cpu_s / self.requests * 1e3


def measure(proxy: overhead.Server, sent: dict[str, bytes], args: argparse.Namespace) -> list[Row]:
    rows: dict[str, Row] = {}
    for name, body in sent.items():
        counts = asyncio.run(send(proxy.url + PATHS[name], body, args.warmup, args.connections))
        rows[name] = Row(name, len(body), ",".join(sorted(counts)))
    for _ in range(args.rounds):
        for name, body in sent.items():
            before = overhead.cpu_seconds(proxy.pid)
            asyncio.run(send(proxy.url + PATHS[name], body, args.requests, args.connections))
            rows[name].cpu_s += overhead.cpu_seconds(proxy.pid) - before
            rows[name].requests += args.requests
    return list(rows.values())


def table(rows: list[Row], args: argparse.Namespace) -> str:
    chat = next(r for r in rows if r.endpoint == "chat")
    lines = [
        f"{args.turns} turns, {args.tools} tools, {args.tokenizer or 'hf: tiny ChatML'}, "
        f"c={args.connections}, {args.rounds} x {args.requests} requests a dialect "
        f"after {args.warmup} warm-up:",
        f"{'endpoint':<11}{'body kB':>9}{'prompt tokens':>15}{'CPU ms/request':>16}{'x chat':>8}",
    ]
    for r in rows:
        ratio = r.ms_per_request / chat.ms_per_request if chat.ms_per_request else float("nan")
        lines.append(
            f"{r.endpoint:<11}{r.body_bytes / 1000:>9.1f}{r.prompt_tokens:>15}"
            f"{r.ms_per_request:>16.3f}{ratio:>8.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=30, help="turns of history [30]")
    parser.add_argument("--tools", type=int, default=24, help="tools declared [24]")
    parser.add_argument("--system-bytes", type=int, default=14_000, help="system prompt [14000]")
    parser.add_argument("--requests", type=int, default=40, help="a dialect's per round [40]")
    parser.add_argument("--rounds", type=int, default=5, help="rounds [5]")
    parser.add_argument("--warmup", type=int, default=10, help="requests before, each [10]")
    parser.add_argument("-c", "--connections", type=int, default=4, help="concurrency [4]")
    parser.add_argument(
        "--tokenizer", default=None, help="TRIMPROXY_TOKENIZER [hf: the tiny tokenizer]"
    )
    args = parser.parse_args(argv)
    if not Path("/proc/self/stat").exists():
        print("bench/dialects.py reads CPU time from /proc (Linux only).", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="trimproxy-dialects-"))
    tokenizer = args.tokenizer or f"hf:{tokenizer_dir(workdir)}"
    sent = bodies(agent(args.turns, args.tools, args.system_bytes))
    sim = start_sim(workdir)
    try:
        proxy = start_proxy(sim, workdir, tokenizer)
        try:
            rows = measure(proxy, sent, args)
        finally:
            proxy.stop()
    finally:
        sim.stop()
    print(table(rows, args))
    shutil.rmtree(workdir, ignore_errors=True)  # kept when it fails: the servers' logs
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
