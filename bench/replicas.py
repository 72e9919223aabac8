"""Several engines behind one model: the cluster's prefix-cache hit ratio by routing.

N real vLLM engines (CPU build, tiny model, ``--kv-blocks`` x 32 tokens of KV cache each,
on 127.0.0.2, .3, ... sharing one port) serve the same conversations through each arm in
turn (tests/e2e/test_engines_vllm.py runs the 120-word arms and asserts their ratios):

* ``session``, ``round_robin``, ``least_loaded``: trimproxy (budget ``--budget``) in front
  of all N engines with that ``TRIMPROXY_ROUTING``;
* ``single``: trimproxy in front of one engine with 1/N of the conversations (the
  per-engine load of the others: what ``session`` should come close to);
* ``router-<policy>``: vllm-router (PyPI ``vllm-router``, installed into its own venv
  under ``.cache`` by this script, never a dependency of trimproxy) with that ``--policy``,
  the client keeping a sliding window of its history under the same budget (what a
  client does without trimproxy).

Every conversation sends ``X-Session-ID`` (vllm-router's ``consistent_hash`` key, and
trimproxy's session identity). The prefix caches are reset before each arm
(``VLLM_SERVER_DEV_MODE=1`` serves ``POST /reset_prefix_cache``) and every arm's text is
its own, so no arm reuses another's blocks. The hit ratio is the sum over the engines of
``vllm:prefix_cache_hits_total`` over the sum of ``vllm:prefix_cache_queries_total``
during the arm.

    .venv/bin/python bench/replicas.py                      # ~10 min on 2 cores
    .venv/bin/python bench/replicas.py --arms session,round_robin --turns 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from tests.support.processes import (  # noqa: E402
    LoggedProcess,
    ProxyProcess,
    free_port,
)
from tests.support.tiny_model import cache_root  # noqa: E402
from tests.support.vllm_stack import VllmStack, build_vllm_model  # noqa: E402

ROUTER_PIN = "vllm-router==0.1.17"
RESULTS = ROOT / "bench" / "results" / "replicas.json"
TRIMPROXY_ARMS = ("session", "round_robin", "least_loaded")
ROUTER_POLICIES = ("round_robin", "consistent_hash", "cache_aware")
DEFAULT_ARMS = ("single", *TRIMPROXY_ARMS, *(f"router-{p}" for p in ROUTER_POLICIES))
SYSTEM = "You are a helpful assistant that answers questions about travel plans."
_WORDS = (  # noqa: SIM905
    "the river runs past the old mill and the mountain road where people walk in the "
    "morning light while a small train carries coffee bread and apples to the city team "
    "project plan needs a clear answer about the token budget the model server memory"
).split()


@dataclass(frozen=True)
class Load:
    conversations: int
    turns: int
    user_words: int
    max_tokens: int
    budget: int
    think_s: float = 0.0
    """The longest pause before a turn (uniform from 0, a seeded draw of its own)."""


@dataclass
class ArmResult:
    arm: str
    engines: int
    conversations: int
    requests: int
    errors: int
    hits: float
    queries: float
    wall_s: float
    first_error: str = ""

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


def engine_stacks(model_dir: Path, count: int, kv_blocks: int, nice: int = 0) -> list[VllmStack]:
    """``count`` engines (not started) on 127.0.0.2, .3, ... sharing one port, as the pods
    behind one DNS name do; each serves ``POST /reset_prefix_cache``."""
    port = free_port()
    return [
        VllmStack(model_dir, kv_blocks=kv_blocks, max_model_len=2048, nice=nice,
                  env={"VLLM_SERVER_DEV_MODE": "1"}, host=f"127.0.0.{2 + i}", port=port)
        for i in range(count)
    ]  # fmt: skip


def start_all(engines: Sequence[VllmStack]) -> None:
    """Start the engines side by side: much of a start is waiting on imports and files,
    so overlapping them costs less than one after another."""
    with ThreadPoolExecutor(len(engines)) as pool:
        for started in [pool.submit(engine.start) for engine in engines]:
            started.result()


def router_python() -> Path:
    """vllm-router's own venv (built once, reused while the pin is the same)."""
    venv = cache_root() / "vllm-router-venv"
    marker = venv / ".pin"
    if not (marker.exists() and marker.read_text() == ROUTER_PIN):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", ROUTER_PIN]
        log = cache_root() / "vllm-router-venv.log"
        with log.open("wb") as out:
            done = subprocess.run(pip, stdout=out, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"pip install {ROUTER_PIN} failed (log {log}):\n{tail}")
        marker.write_text(ROUTER_PIN)
    return venv / "bin" / "vllm-router"


def wait_until_healthy(url: str, proc: LoggedProcess, timeout: float = 120.0) -> None:
    """vllm-router's ``/health`` answers 200 with plain text (not JSON) once it serves."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"vllm-router exited:\n{proc.logs()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"vllm-router not healthy after {timeout:.0f} s:\n{proc.logs()[-3000:]}")


def user_text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def sliding_window(
    history: list[dict[str, str]], tokenizer: Tokenizer, budget: int
) -> list[dict[str, str]]:
    """What a client does without trimproxy: the system message and the newest messages
    that fit ``budget`` (4 tokens of framing a message), starting at a user message."""
    system, rest = history[0], history[1:]
    used = len(tokenizer.encode(system["content"]).ids) + 4
    kept: list[dict[str, str]] = []
    for message in reversed(rest):
        cost = len(tokenizer.encode(message["content"]).ids) + 4
        if used + cost > budget and kept:
            break
        kept.insert(0, message)
        used += cost
    while kept and kept[0]["role"] != "user":
        kept.pop(0)
    return [system, *kept]


async def conversation(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    name: str,
    load: Load,
    seed: str,
    window: Tokenizer | None,
    outcome: dict[str, Any],
) -> None:
    rng, think = random.Random(seed), random.Random(f"{seed}/think")
    history = [{"role": "system", "content": SYSTEM}]
    for _turn in range(load.turns):
        if load.think_s:
            await asyncio.sleep(think.uniform(0, load.think_s))
        history.append({"role": "user", "content": user_text(rng, load.user_words)})
        messages = history if window is None else sliding_window(history, window, load.budget)
        body = {
            "model": model,
            "messages": messages,
            "max_tokens": load.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        outcome["requests"] += 1
        try:
            response = await client.post(url, json=body, headers={"X-Session-ID": name})
        except httpx.HTTPError as exc:
            outcome["errors"] += 1
            outcome["first_error"] = outcome["first_error"] or repr(exc)
            history.append({"role": "assistant", "content": "(no answer)"})
            continue
        if response.status_code != 200:
            outcome["errors"] += 1
            outcome["first_error"] = outcome["first_error"] or response.text[:300]
            history.append({"role": "assistant", "content": "(no answer)"})
            continue
        history.append(
            {"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]}
        )


def counters(engines: Sequence[VllmStack]) -> tuple[float, float]:
    hits = queries = 0.0
    for engine in engines:
        text = httpx.get(f"{engine.base_url}/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total"):
                queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


def reset_caches(engines: Sequence[VllmStack]) -> None:
    for engine in engines:
        httpx.post(f"{engine.base_url}/reset_prefix_cache", timeout=30).raise_for_status()


async def drive(
    url: str, model: str, load: Load, arm: str, names: Sequence[str], window: Tokenizer | None
) -> dict[str, Any]:
    outcome: dict[str, Any] = {"requests": 0, "errors": 0, "first_error": ""}
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:
        await asyncio.gather(
            *(
                conversation(client, url, model, name, load, f"{arm}/{name}", window, outcome)
                for name in names
            )
        )
    return outcome


def run_arm(
    arm: str, engines: Sequence[VllmStack], load: Load, model_dir: Path, workdir: Path
) -> ArmResult:
    used = list(engines[:1]) if arm == "single" else list(engines)
    count = max(1, load.conversations // len(engines)) if arm == "single" else load.conversations
    names = [f"conv-{i}" for i in range(count)]
    reset_caches(used)
    before = counters(used)
    began = time.monotonic()
    with ExitStack() as stack:
        window: Tokenizer | None = None
        if arm.startswith("router-"):
            port = free_port()
            argv = [str(router_python()), "--host", "127.0.0.1", "--port", str(port),
                    "--policy", arm.removeprefix("router-"),
                # Its own exporter port: the default one may be taken (another router).
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                    "--worker-urls", *(e.base_url for e in used)]  # fmt: skip
            router = LoggedProcess(argv, {"PATH": "/usr/bin:/bin"}, workdir, f"router-{port}")
            stack.callback(router.stop)
            wait_until_healthy(f"http://127.0.0.1:{port}/health", router)
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            window = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        else:
            routing = "session" if arm == "single" else arm
            proxy = ProxyProcess(
                settings={
                    "upstream_url": ",".join(e.base_url for e in used),
                    "routing": routing,
                    "max_prompt_tokens": load.budget,
                    "tokenizer": f"hf:{model_dir}",
                },
                startup_timeout=120.0,
            ).start()
            stack.callback(proxy.stop)
            url = f"{proxy.api_base}/chat/completions"
        began = time.monotonic()
        outcome = asyncio.run(drive(url, used[0].model, load, arm, names, window))
    wall = time.monotonic() - began
    after = counters(used)
    return ArmResult(
        arm, len(used), count, outcome["requests"], outcome["errors"],
        after[0] - before[0], after[1] - before[1], wall, outcome["first_error"],
    )  # fmt: skip


def report(results: Sequence[ArmResult]) -> str:
    lines = [
        "| arm | engines | conversations | requests | errors | hit ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            f"| {r.arm} | {r.engines} | {r.conversations} | {r.requests} | {r.errors} "
            f"| {r.hit_ratio:.3f} |"
        )
    by_arm = {r.arm: r.hit_ratio for r in results}
    if "session" in by_arm and "single" in by_arm and by_arm["single"]:
        lines.append(
            f"\nsession / single: {by_arm['session'] / by_arm['single']:.2f} (goal >= 0.9)"
        )
    routers = [v for k, v in by_arm.items() if k.startswith("router-")]
    if "session" in by_arm and routers and max(routers):
        best = max(routers)
        lines.append(
            f"session / best vllm-router policy: {by_arm['session'] / best:.2f} (goal >= 4)"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, default=3)
    parser.add_argument("--kv-blocks", type=int, default=127, help="KV blocks of 32 tokens")
    parser.add_argument("--conversations", type=int, default=9)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--user-words", type=int, default=60)
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--budget", type=int, default=1000)
    parser.add_argument(
        "--think", type=float, default=0.0, help="a user's longest pause before a turn, s"
    )
    parser.add_argument("--arms", default=",".join(DEFAULT_ARMS))
    args = parser.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    unknown = set(arms) - set(DEFAULT_ARMS)
    if unknown:
        parser.error(f"unknown arms {sorted(unknown)}; choose from {', '.join(DEFAULT_ARMS)}")
    load = Load(
        args.conversations, args.turns, args.user_words, args.max_tokens, args.budget, args.think
    )
    if any(a.startswith("router-") for a in arms):
        router_python()  # before the engines: a failed install costs no engine start
    model_dir = build_vllm_model()
    workdir = cache_root() / "bench-replicas"
    workdir.mkdir(parents=True, exist_ok=True)
    results: list[ArmResult] = []
    with ExitStack() as stack:
        engines = engine_stacks(model_dir, args.engines, args.kv_blocks)
        for engine in engines:
            stack.callback(engine.stop)
        start_all(engines)
        for engine in engines:
            print(f"engine {engine.base_url} up in {engine.timings.ready:.0f} s", flush=True)
        for arm in arms:
            result = run_arm(arm, engines, load, model_dir, workdir)
            results.append(result)
            print(
                f"{arm}: hit ratio {result.hit_ratio:.3f}, {result.requests} requests, "
                f"{result.errors} errors, {result.wall_s:.0f} s {result.first_error}",
                flush=True,
            )
    print(report(results))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "load": asdict(load),
        "kv_blocks": args.kv_blocks,
        "results": [{**asdict(r), "hit_ratio": r.hit_ratio} for r in results],
    }
    RESULTS.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
