"""The seed's OOM, bounded: a transformers worker's memory under a burst of long prompts.

FastChat's ``model_worker`` runs one ``generate`` per request, each with its own KV
cache, so its resident memory grows with how many long prompts run at once;
``--limit-worker-concurrency`` counts requests, not tokens. With
``TRIMPROXY_KV_ADMISSION`` set to about one and a half prompts' worth, the proxy lets
them in one at a time, and the worker's peak stays near the one-at-a-time figure.

The model is a tiny but wider Llama (8 layers, hidden 256, 4 heads of 64, fp32):
2 x 8 x 4 x 64 x 4 bytes = 16 KiB of KV a token, so 8 prompts of ~2,876 tokens at once
hold ~360 MB of KV plus the attention scratch of each forward. The peak is the worker's
``VmHWM`` above its resident size right before the burst; ``clear_refs`` resets the
high-water mark between the two bursts, and the proxied burst goes first so that
memory the allocator kept from the other one cannot hide in its idle level.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.fastchat_stack import FastChatStack
from tests.support.processes import ProxyProcess
from tests.support.tiny_model import ModelShape, render_fastchat_prompt

pytestmark = pytest.mark.fastchat

WIDE = ModelShape(
    layers=8,
    hidden=256,
    heads=4,
    kv_heads=4,
    head_dim=64,
    intermediate=512,
    max_position=4096,
    dtype="float32",
)
PROMPT_TOKENS = 2876
MAX_TOKENS = 8
BURST = 8
CAPACITY = 4200  # one prompt + reserve fits, two do not

_WORDS = (  # noqa: SIM905
    "the river runs past the old mill and the mountain road where people walk in the "
    "morning light while a small train carries coffee bread and apples to the city"
).split()


@pytest.fixture(scope="module")
def wide_stack() -> Iterator[FastChatStack]:
    if os.environ.get("TRIMPROXY_SKIP_FASTCHAT") == "1":
        pytest.skip("TRIMPROXY_SKIP_FASTCHAT=1: the real FastChat stack is switched off")
    # A folder of its own: the session's default stack has trimproxy-fastchat-<pid>.
    stack = FastChatStack(folder="trimproxy-fastchat-kv", shape=WIDE, worker_concurrency=BURST)
    with stack:
        yield stack


def prompts(model_dir: Path) -> list[list[dict[str, str]]]:
    """``BURST`` different single-turn conversations of about ``PROMPT_TOKENS`` each."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    out = []
    for seed in range(BURST):
        rng = random.Random(seed)
        words = [f"Request {seed}:"]
        while True:
            words.extend(rng.choice(_WORDS) for _ in range(50))
            messages = [{"role": "user", "content": " ".join(words)}]
            if len(tokenizer.encode(render_fastchat_prompt(messages)).ids) >= PROMPT_TOKENS:
                out.append(messages)
                break
    return out


def status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/{pid}/status")


async def burst(base_url: str, model: str, conversations: list[list[dict[str, str]]]) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:

        async def one(messages: list[dict[str, str]]) -> None:
            body = {"model": model, "messages": messages, "max_tokens": MAX_TOKENS}
            response = await client.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text

        await asyncio.gather(*(one(m) for m in conversations))


def peak_mb(
    stack: FastChatStack, base_url: str, conversations: list[list[dict[str, str]]]
) -> float:
    """The worker's peak resident memory during one burst, above its level before it."""
    pid = stack.procs["worker"].pid
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS now
    idle = status_kb(pid, "VmRSS")
    asyncio.run(burst(base_url, stack.model, conversations))
    return (status_kb(pid, "VmHWM") - idle) / 1024


def test_admission_bounds_the_workers_memory(wide_stack: FastChatStack) -> None:
    conversations = prompts(wide_stack.model_dir)
    settings: dict[str, str | int | float] = {
        "tokenizer": f"hf:{wide_stack.model_dir}",
        "context_window": WIDE.max_position,
        "kv_admission": CAPACITY,
        "admission_timeout": 600,
    }
    with ProxyProcess(settings=dict(settings, upstream_url=wide_stack.base_url)) as proxy:
        through = peak_mb(wide_stack, proxy.base_url, conversations)
        metrics = httpx.get(f"{proxy.base_url}/metrics").text
    straight = peak_mb(wide_stack, wide_stack.base_url, conversations)
    print(
        f"\nworker peak above idle: straight {straight:.0f} MB, through the proxy {through:.0f} MB"
    )
    assert "trimproxy_admission_wait_seconds_count 8.0" in metrics
    assert through < straight / 2, (through, straight)
