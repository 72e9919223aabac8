"""``trimproxy top [URL]``: read the proxy's ``/metrics`` every ``--interval`` seconds
and show the engines and the proxy's own figures.

On a terminal the screen is redrawn in place, like ``nvidia-smi dmon`` or ``top``;
otherwise (a pipe, a log file) each reading is printed as a block of plain lines with
its time. ``--once`` prints one reading and exits: totals, as there is no earlier
reading to take rates from. A proxy that does not answer is said on the screen and
asked again at the next tick; ``--once`` then exits 1.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TextIO

from proxy.top.render import lines
from proxy.top.snapshot import Snapshot, read, window

DEFAULT_URL = "http://127.0.0.1:8080"
_CLEAR = "\x1b[H\x1b[2J"


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    top = commands.add_parser(
        "top",
        help="live view of a running proxy from its /metrics (engines, prompts, errors)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    top.add_argument("url", nargs="?", default=DEFAULT_URL, help=f"the proxy [{DEFAULT_URL}]")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between readings [1]")
    top.add_argument("--once", action="store_true", help="print one reading and exit")
    top.add_argument(
        "--count", type=int, default=0, help="stop after this many readings [0: never]"
    )


def metrics_url(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/metrics") else url + "/metrics"


def fetch(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
    return body.decode("utf-8", "replace")


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        print("trimproxy top: --interval must be above 0", file=sys.stderr)
        return 2
    return watch(args.url, args.interval, 1 if args.once else args.count, sys.stdout)


def watch(
    url: str,
    interval: float,
    count: int,
    out: TextIO,
    get: Callable[[str], str] = fetch,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Read, show, wait; ``count`` readings (0: until interrupted). Exit status 1 when
    the last reading failed."""
    live = out.isatty() and count != 1
    before: Snapshot | None = None
    shown = 0
    failed = False
    try:
        while True:
            try:
                now = read(get(metrics_url(url)), clock())
                screen = lines(window(before, now), url)
                before, failed = now, False
            except (OSError, urllib.error.URLError, ValueError) as exc:
                screen = [f"trimproxy top — {url}: no answer ({exc}); asking again"]
                failed = True
            _show(out, screen, live)
            shown += 1
            if count and shown >= count:
                return 1 if failed else 0
            sleep(interval)
    except KeyboardInterrupt:
        return 0


def _show(out: TextIO, screen: list[str], live: bool) -> None:
    if live:
        out.write(_CLEAR + "\n".join(screen) + "\n")
    else:
        out.write(time.strftime("%Y-%m-%dT%H:%M:%S") + "\n" + "\n".join(screen) + "\n\n")
    out.flush()
