"""The response store's bytes per stored turn against the conversation's own size.

For chains of 1, 30 and 200 turns (each turn a user message of ``--turn-bytes`` and a
short answer, as the proxy stores them: the turn's own input, the response object,
the parent's key), it stores each chain in the in-memory store and in a real Redis
(loopback, no persistence) and prints:

* ``conversation``: the bytes of the chain's input and output items as JSON, what a
  client sent and got;
* ``memory``: what the in-memory store holds (it keeps entries encoded), and the
  process's traced allocations (``tracemalloc``) while it holds them;
* ``redis``: the growth of Redis's ``used_memory``;
* each as a ratio to the conversation, and the ratio the earlier layout (each entry
  the whole chain so far) would have had: (turns + 1) / 2.

    .venv/bin/python bench/response_store.py                 # ~10 s
    .venv/bin/python bench/response_store.py --turns 1,30,200 --turn-bytes 200000
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from proxy.chains.entry import Stored  # noqa: E402
from proxy.chains.memory import MemoryStore  # noqa: E402
from proxy.chains.redis_store import RedisStore  # noqa: E402
from proxy.chains.store import ResponseStore  # noqa: E402
from tests.support.redis_server import REDIS_BIN, RedisServer  # noqa: E402

BIG = 1 << 40


def chain(turns: int, turn_bytes: int) -> list[Stored]:
    """A chain as the proxy stores it, one entry per turn."""
    out: list[Stored] = []
    parent = None
    for n in range(turns):
        text = {"type": "output_text", "text": f"answer {n} " + "ok " * 20}
        output = [{"type": "message", "role": "assistant", "content": [text]}]
        response = {"id": f"resp_{n:048x}", "object": "response", "output": output}
        user = [{"role": "user", "content": f"turn {n} " + "w" * turn_bytes}]
        out.append(Stored(response, user, "ns:session", "session", parent))
        parent = f"{n:024x}"
    return out


def conversation_bytes(entries: list[Stored]) -> int:
    return len(orjson.dumps([item for e in entries for item in e.items()]))


async def fill(store: ResponseStore, entries: list[Stored]) -> None:
    for n, entry in enumerate(entries):
        assert await store.put(f"{n:024x}", entry.encode())
    walked = await store.chain(f"{len(entries) - 1:024x}", BIG)
    assert walked is not None and len(walked.entries) == len(entries)


async def memory_row(entries: list[Stored]) -> tuple[int, int]:
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    store = MemoryStore(10**6, 3600.0, max_bytes=BIG)
    await fill(store, entries)
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    held = store.held()
    assert held is not None
    await store.aclose()
    return held[1], traced


async def redis_row(server: RedisServer, entries: list[Stored]) -> int:
    inspect = server.client()
    inspect.flushall()
    store = RedisStore(server.url, 3600.0, 10**6, max_bytes=BIG, timeout=30.0)
    try:
        # The scripts loaded and a connection open first: their memory is no entry's.
        await fill(store, chain(1, 10))
        await store.delete(f"{0:024x}")
        before = _used(inspect.info("memory"))
        await fill(store, entries)
        return _used(inspect.info("memory")) - before
    finally:
        await store.aclose()
        inspect.flushall()
        inspect.close()


def _used(info: Any) -> int:
    return int(info["used_memory"])


async def run(turn_counts: list[int], turn_bytes: int) -> list[dict[str, Any]]:
    rows = []
    if REDIS_BIN is None:
        raise SystemExit("bench: redis-server is not installed (apt-get install redis-server)")
    with tempfile.TemporaryDirectory(prefix="trimproxy-bench-") as tmp:
        server = RedisServer(REDIS_BIN, Path(tmp))
        server.start()
        try:
            rows = await _rows(server, turn_counts, turn_bytes)
        finally:
            server.stop()
    return rows


async def _rows(
    server: RedisServer, turn_counts: list[int], turn_bytes: int
) -> list[dict[str, Any]]:
    rows = []
    for turns in turn_counts:
        entries = chain(turns, turn_bytes)
        size = conversation_bytes(entries)
        held, traced = await memory_row(entries)
        redis = await redis_row(server, entries)
        rows.append(
            {"turns": turns, "conversation": size, "memory": held, "traced": traced,
             "redis": redis, "whole_chain": (turns + 1) / 2}
        )  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", default="1,30,200", help="chain lengths, comma-separated")
    parser.add_argument("--turn-bytes", type=int, default=20_000, help="bytes of each user turn")
    args = parser.parse_args(argv)
    counts = [int(t) for t in args.turns.split(",")]
    rows = asyncio.run(run(counts, args.turn_bytes))
    print(f"turn bytes {args.turn_bytes}; ratios are bytes held / conversation bytes")
    print(f"{'turns':>6} {'conversation':>13} {'memory':>8} {'traced':>8} {'redis':>8} "
          f"{'whole-chain layout':>19}")  # fmt: skip
    for r in rows:
        size = r["conversation"]
        print(f"{r['turns']:>6} {size:>13} {r['memory'] / size:>8.3f} {r['traced'] / size:>8.3f} "
              f"{r['redis'] / size:>8.3f} {r['whole_chain']:>19.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
