"""Instructions per request of each proxy, under callgrind: a cost that does not drift.

Wall-clock cells on a shared 2-core machine move by tens of percent with the load;
the instructions a process executes per request hardly move at all. Each target of
``bench/overhead.py`` (the sim as upstream, the same 20-message body) is started under
``valgrind --tool=callgrind``, warmed with ``--warmup`` requests, and then sent
``--requests`` more at ``-c`` concurrency by an aiohttp client outside valgrind; the
counters are dumped before and after (``callgrind_control -d``), so start-up is not
counted. The proxies' scrape of the sim's ``/metrics`` is off (``--scrape`` keeps it):
it runs on a timer, so its share of a request follows the wall time, which valgrind
and the machine's load stretch (~1 % from run to run). Prints Ir (instructions) per
request and the ratio to ``floor``.

    .venv/bin/python bench/callgrind_cost.py                       # ~8 min: 3 targets
    .venv/bin/python bench/callgrind_cost.py --targets trimproxy,floor --requests 200
    .venv/bin/python bench/callgrind_cost.py --paced -c 1 --requests 100 --warmup 10
    .venv/bin/python bench/callgrind_cost.py --dialect messages --targets trimproxy,trimproxy-base
    .venv/bin/python bench/callgrind_cost.py --dialect responses --peer-body -c 1

``--dialect`` sends the same conversation in another wire format, to its route: the
Responses API (``instructions`` and the turns as input messages), Anthropic Messages
(``system`` and the turns) or completions (the turns' text as one prompt; refused over
the budget, so not with the ``-trim`` targets).

Needs valgrind (``apt-get install valgrind``); a target starts in 1-2 minutes under it.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import overhead, responses_peer  # noqa: E402

#: Each wire format's route (``--dialect``).
PATHS = {
    "chat": overhead.CHAT_PATH,
    "responses": "/v1/responses",
    "messages": "/v1/messages",
    "completions": "/v1/completions",
}


def dialect_body(dialect: str, stream: bool, store: bool = True) -> bytes:
    """``overhead.chat_body``'s conversation in ``dialect``'s wire format; a Responses
    request with ``store: false`` unless ``store``."""
    chat = json.loads(overhead.chat_body(stream))
    if dialect == "chat":
        return json.dumps(chat).encode()
    system, *turns = chat["messages"]
    body: dict[str, Any] = {"model": chat["model"]}
    if dialect == "responses":
        body |= {"instructions": system["content"], "input": turns, "max_output_tokens": 64}
        if not store:
            body["store"] = False
    elif dialect == "messages":
        body |= {"system": system["content"], "messages": turns, "max_tokens": 64}
    else:
        body |= {"prompt": "\n".join(m["content"] for m in chat["messages"]), "max_tokens": 64}
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


async def _load(url: str, body: bytes, count: int, concurrency: int, path: str) -> None:
    import aiohttp

    slots = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            headers = {"content-type": "application/json"}
            async with slots, session.post(url + path, data=body, headers=headers) as response:
                await response.read()
                if response.status != 200:
                    raise SystemExit(f"{url} answered {response.status}")

        await asyncio.gather(*(one() for _ in range(count)))


def instructions_per_request(
    name: str, sim: overhead.Server, workdir: Path, body: bytes, args: argparse.Namespace
) -> float:
    out = workdir / f"{name}.callgrind"
    spawn = overhead._spawn
    scrape: bool = args.scrape

    def under_valgrind(
        name: str, args: list[str], workdir: Path, env: dict[str, str]
    ) -> overhead.Server:
        wrapped = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p", *args]
        if not scrape:
            env = {**env, "TRIMPROXY_UPSTREAM_METRICS_INTERVAL": "0"}
        return spawn(name, wrapped, workdir, env)

    overhead._spawn = under_valgrind
    wait = overhead._wait_http
    overhead._wait_http = lambda server, path, timeout=30.0: wait(server, path, 900.0)
    try:
        server = overhead.start_target(name, sim, workdir, args.baseline)
    finally:
        overhead._spawn, overhead._wait_http = spawn, wait
    dump = ["callgrind_control", "-d", str(server.pid)]  # writes a part, zeroes the counters
    try:
        path = PATHS[args.dialect]
        asyncio.run(_load(server.url, body, args.warmup, args.connections, path))
        subprocess.run(dump, check=True, capture_output=True)
        asyncio.run(_load(server.url, body, args.requests, args.connections, path))
        subprocess.run(dump, check=True, capture_output=True)
    finally:
        server.stop()
    parts = sorted(glob.glob(f"{out}.{server.pid}.*"), key=os.path.getmtime)
    text = Path(parts[-1]).read_text(errors="replace")
    total = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.M)
    if total is None:
        raise SystemExit(f"no totals in {parts[-1]}")
    requests: int = args.requests
    return int(total.group(1)) / requests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="trimproxy,floor,floor-aiohttp")
    parser.add_argument("--requests", type=int, default=400, help="measured requests [400]")
    parser.add_argument("--warmup", type=int, default=64, help="requests before [64]")
    parser.add_argument("-c", "--connections", type=int, default=16, help="concurrency [16]")
    parser.add_argument("--stream", action="store_true", help="the streamed body instead")
    parser.add_argument(
        "--dialect", choices=tuple(PATHS), default="chat", help="the wire format sent [chat]"
    )
    parser.add_argument(
        "--no-store",
        action="store_true",
        help="with --dialect responses: store: false (the request is kept nowhere, as "
        "responses_peer.py's stateless list)",
    )
    parser.add_argument(
        "--peer-body",
        action="store_true",
        help="with --dialect responses: responses_peer.py's stateless list (10 turns of "
        "short texts, 4 kB, store: false) instead of this bench's 20 messages",
    )
    parser.add_argument(
        "--paced",
        action="store_true",
        help="streamed at an engine's pace (overhead.py's paced mode; use -c 1: under "
        "valgrind a proxy keeps up with one such stream, not sixteen)",
    )
    parser.add_argument(
        "--scrape",
        action="store_true",
        help="keep the proxies' /metrics scrape of the sim on (off by default: it runs on a "
        "timer, so its share of a request follows the wall time valgrind takes, ~1 %% apart "
        "from run to run)",
    )
    parser.add_argument("--baseline", type=Path, default=None, help="for the -base targets")
    parser.add_argument(
        "--keep", type=Path, default=None, help="keep the callgrind files here (callgrind_annotate)"
    )
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("bench/callgrind_cost.py needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 2
    targets = [t for t in args.targets.split(",") if t and t != "direct"]
    workdir = Path(tempfile.mkdtemp(prefix="trimproxy-callgrind-"))
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        workdir = args.keep
    body = dialect_body(args.dialect, args.stream or args.paced, store=not args.no_store)
    if args.peer_body:
        if args.dialect != "responses":
            parser.error("--peer-body is a Responses body: give --dialect responses")
        body = responses_peer.stateless_body(stream=args.stream or args.paced)
    sim = overhead.start_sim(workdir)
    if args.paced:
        overhead.pace_sim(sim, "paced")
    costs: dict[str, float] = {}
    try:
        for name in targets:
            costs[name] = instructions_per_request(name, sim, workdir, body, args)
            print(f"  {name:<18}{costs[name]:>12,.0f} Ir/request", flush=True)
    finally:
        sim.stop()
    floor = costs.get(overhead.FLOOR)
    mode = "paced" if args.paced else "streamed" if args.stream else "non-streamed"
    runs = f"{args.requests} requests after {args.warmup}"
    print(f"\n{args.dialect}, {mode}, c={args.connections}, {runs}:")
    for name, cost in costs.items():
        ratio = f"{cost / floor:.2f}x floor" if floor else ""
        print(f"{name:<18}{cost:>12,.0f} Ir/request  {ratio}")
    if args.keep is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
