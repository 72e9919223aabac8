"""The Responses path's CPU per request beside vLLM's own Rust gateway, agentic-api.

Both gateways stand in front of one ``trimproxy sim`` (vLLM's dialect, answers at once)
and get the same requests from an aiohttp client; each arm's CPU is the gateway
process's utime + stime (from /proc) over its requests, per request. The arms are
interleaved round by round, so a load change on this shared machine falls on all.
Beside them, ``floor-aiohttp`` (``bench/floor_aiohttp.py``: aiohttp's server and
client relaying the bytes, nothing parsed) is what any Python gateway pays before it
does anything, and ``floor-uvicorn`` (``bench/floor_uvicorn_aiohttp.py``: uvicorn and a
bare ASGI callable, the same relay) what trimproxy's own server pays without a
framework; they store nothing, so they have no ``chains`` cell. ``--baseline DIR``
adds ``trimproxy-base``, the proxy of another checkout, in the same rounds.

* ``stateless``: a 10-turn ``input`` list (10 user, 9 assistant messages, ~4 kB),
  ``store: false``;
* ``streamed``: the same, ``stream: true``;
* ``chains``: ``--chains`` conversations of 10 turns by ``previous_response_id``
  (both gateways store every answer), one new user message a turn.

agentic-api (``agentic-api==0.9.0`` from PyPI) is installed into its own venv under
``.cache/agentic-venv`` the first time. trimproxy counts with ``approx`` (its default
without a tokenizer) and trims nothing here: the window is larger than any body.

    .venv/bin/python bench/responses_peer.py                  # ~2 min
    .venv/bin/python bench/responses_peer.py --rounds 3 --requests 500 -c 16
    .venv/bin/python bench/responses_peer.py --baseline /work/wt/base
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import overhead  # noqa: E402

PEER_PIN = "agentic-api==0.9.0"
MODEL = "sim-model"
WORKLOADS = ("stateless", "streamed", "chains")
PEER, OURS, BASE = "agentic-api", "trimproxy", "trimproxy-base"
FLOORS = ("floor-aiohttp", "floor-uvicorn")
_PROSE = (
    "the agent reads the failing test opens the module and explains which change keeps "
    "every caller working before it edits one function and runs the suite again"
)
_WORDS = _PROSE.split(" ")


def _text(turn: int, words: int = 30) -> str:
    return " ".join(_WORDS[(turn + i) % len(_WORDS)] for i in range(words))


def stateless_body(stream: bool = False, turns: int = 10) -> bytes:
    """``turns`` user messages with the answers between them: 2 * turns - 1 items."""
    items: list[dict[str, Any]] = []
    for turn in range(turns):
        if turn:
            items.append({"role": "assistant", "content": _text(turn + 50)})
        items.append({"role": "user", "content": _text(turn)})
    body = {"model": MODEL, "input": items, "store": False, "max_output_tokens": 16}
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


def chain_body(turn: int, previous: str | None) -> bytes:
    body: dict[str, Any] = {"model": MODEL, "input": _text(turn), "max_output_tokens": 16}
    if previous is not None:
        body["previous_response_id"] = previous
    return json.dumps(body).encode()


def peer_server() -> Path:
    """agentic-server from its own venv (built once, reused while the pin is the same)."""
    venv = ROOT / ".cache" / "agentic-venv"
    binary = venv / "bin" / "agentic-server"
    stamp = venv / "pin.txt"
    if binary.exists() and stamp.exists() and stamp.read_text() == PEER_PIN:
        return binary
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", PEER_PIN], check=True)
    stamp.write_text(PEER_PIN)
    return binary


def start_peer(sim: overhead.Server, workdir: Path) -> overhead.Server:
    port = overhead._free_port()
    args = [str(peer_server()), "--llm-api-base", sim.url + "/v1", "--gateway-host",
            "127.0.0.1", "--gateway-port", str(port), "--db-url",
            f"sqlite://{workdir / 'agentic.db'}"]  # fmt: skip
    server = overhead._spawn("agentic-api", args, workdir, overhead._env({}))
    server.url = f"http://127.0.0.1:{port}"
    overhead._wait_http(server, "/health", 60.0)
    return server


def start_proxy(
    sim: overhead.Server, workdir: Path, baseline: Path | None = None
) -> overhead.Server:
    """trimproxy serve, this checkout's, or ``baseline``'s (``trimproxy-base``)."""
    port = overhead._free_port()
    settings = {
        "TRIMPROXY_UPSTREAM_URL": sim.url,
        "TRIMPROXY_TOKENIZER": "approx",
        "TRIMPROXY_CONTEXT_WINDOW": str(overhead.CONTEXT),
        "TRIMPROXY_UPSTREAM_METRICS_INTERVAL": "0",
    }
    args = [sys.executable, "-m", "proxy.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    env = overhead._env(settings)
    if baseline is not None:
        env["PYTHONPATH"] = os.pathsep.join((str(baseline.resolve()), env["PYTHONPATH"]))
    name = OURS if baseline is None else BASE
    server = overhead._spawn(name, args, workdir, env)
    server.url = f"http://127.0.0.1:{port}"
    overhead._wait_http(server, "/healthz", 60.0)
    return server


async def _post(session: Any, url: str, body: bytes) -> dict[str, Any]:
    async with session.post(url, data=body, headers={"content-type": "application/json"}) as r:
        raw = await r.read()
        if r.status != 200:
            raise SystemExit(f"{url} answered {r.status}: {raw[:300]!r}")
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            if b"response.completed" not in raw:
                raise SystemExit(f"{url}: a stream without response.completed: {raw[-300:]!r}")
            return {}
        answer: dict[str, Any] = json.loads(raw)
        return answer


async def send(url: str, workload: str, count: int, concurrency: int) -> None:
    """``count`` requests of ``workload``; chains of 10 turns for ``chains``."""
    import aiohttp

    slots = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:
        if workload != "chains":
            body = stateless_body(stream=workload == "streamed")

            async def one() -> None:
                async with slots:
                    await _post(s, url, body)

            await asyncio.gather(*(one() for _ in range(count)))
            return

        async def chain() -> None:
            previous: str | None = None
            for turn in range(10):
                async with slots:
                    previous = (await _post(s, url, chain_body(turn, previous)))["id"]

        await asyncio.gather(*(chain() for _ in range(max(1, count // 10))))


@dataclass
class Cell:
    cpu_s: float = 0.0
    requests: int = 0

    @property
    def ms(self) -> float:
        return self.cpu_s / self.requests * 1e3 if self.requests else float("nan")


def measure(
    arms: dict[str, overhead.Server], args: argparse.Namespace
) -> dict[tuple[str, str], Cell]:
    cells = {(arm, w): Cell() for arm in arms for w in args.workloads}
    for arm, server in arms.items():
        for workload in args.workloads:
            if _serves(arm, workload):
                asyncio.run(send(server.url + "/v1/responses", workload, 20, args.connections))
    for _ in range(args.rounds):
        for workload in args.workloads:
            for arm, server in arms.items():
                if not _serves(arm, workload):
                    continue
                before = overhead.cpu_seconds(server.pid)
                url = server.url + "/v1/responses"
                asyncio.run(send(url, workload, args.requests, args.connections))
                cell = cells[arm, workload]
                cell.cpu_s += overhead.cpu_seconds(server.pid) - before
                cell.requests += args.requests if workload != "chains" else args.requests // 10 * 10
    return cells


def _serves(arm: str, workload: str) -> bool:
    return arm not in FLOORS or workload != "chains"


def table(cells: dict[tuple[str, str], Cell], args: argparse.Namespace) -> str:
    """agentic-api's ms a request, then each other arm's and its ratio to that (``nan``
    where a cell has none: the floors' chains, or a peer cell read as 0 ticks)."""
    arms = [a for a in (OURS, *FLOORS, BASE) if (a, args.workloads[0]) in cells]
    lines = [
        f"c={args.connections}, {args.rounds} rounds x {args.requests} requests a workload and arm",
        f"{'workload':<11}{PEER + ' ms':>16}"
        + "".join(f"{a + ' ms':>18}{'ratio':>7}" for a in arms),
    ]
    for w in args.workloads:
        peer = cells[PEER, w].ms
        row = f"{w:<11}{peer:>16.3f}"
        for arm in arms:
            ms = cells[arm, w].ms
            # CPU time comes in clock ticks (10 ms): a short run may read 0 for the peer.
            row += f"{ms:>18.3f}{ms / peer if peer else float('nan'):>7.2f}"
        lines.append(row)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="per round, arm, workload [200]")
    parser.add_argument("--rounds", type=int, default=3, help="rounds [3]")
    parser.add_argument("-c", "--connections", type=int, default=16, help="concurrency [16]")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument(
        "--baseline", type=Path, default=None, help="another checkout, as trimproxy-base"
    )
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="trimproxy-responses-peer-"))
    sim = overhead.start_sim(workdir)
    arms: dict[str, overhead.Server] = {}
    try:
        arms[PEER] = start_peer(sim, workdir)
        for floor in FLOORS:
            arms[floor] = overhead.start_floor(floor, sim.url, workdir)
        arms[OURS] = start_proxy(sim, workdir)
        if args.baseline is not None:
            arms[BASE] = start_proxy(sim, workdir, args.baseline)
        cells = measure(arms, args)
    finally:
        for server in arms.values():
            server.stop()
        sim.stop()
    print(table(cells, args))
    shutil.rmtree(workdir, ignore_errors=True)  # kept when it fails: the servers' logs
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
