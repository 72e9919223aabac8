"""A ``Window`` as lines of text: the engines' table, then the proxy's own figures.

The same lines serve the live screen (redrawn in place on a terminal) and the log
(``--once``, or output that is not a terminal): plain text, no colour, so that a line
read in a log file says what the screen said.
"""

from __future__ import annotations

import math

from proxy.top.snapshot import EngineRow, Histogram, Window

_COLUMNS = ("engine", "up", "kv use", "reserved/capacity", "run", "wait", "hit ratio", "preempt",
            "requests")  # fmt: skip
_WIDTHS = (24, 4, 7, 19, 5, 5, 10, 8, 9)


def lines(view: Window, url: str) -> list[str]:
    """The screen for ``view`` of the proxy at ``url``."""
    out = [f"trimproxy top — {url}   (every figure from its /metrics)", ""]
    out.append(_row(_COLUMNS))
    for name, engine in sorted(view.now.engines.items()):
        out.append(_row(_engine_cells(name, engine)))
    out.append("")
    out.append("prompt tokens   " + _prompt(view.prompt.get("received"), "received") + "   "
               + _prompt(view.prompt.get("forwarded"), "forwarded"))  # fmt: skip
    per = "/s" if view.seconds else " (totals: rates from the next reading on)"
    requests = (
        sum(view.requests.values()) if view.seconds else sum(view.now.requests_by_code.values())
    )
    trims = view.trims if view.seconds else view.now.trims
    resets = view.session_resets if view.seconds else view.now.session_resets
    out.append(
        f"requests {_num(requests)}{per}   trims {_num(trims)}   session resets {_num(resets)}"
        f"   in flight {_num(view.now.in_flight)}   admission: rejected "
        f"{_num(view.now.admission_rejected)}, overruns {_num(view.now.overruns)}"
    )
    errors = view.errors if view.seconds else _error_totals(view)
    shown = ", ".join(f"{code} {_num(n)}" for code, n in errors.items() if n) or "none"
    out.append(f"errors{per if view.seconds else ''}   {shown}")
    return out


def _error_totals(view: Window) -> dict[str, float]:
    now = view.now
    errors = {c: n for c, n in sorted(now.requests_by_code.items()) if c[:1] in "45"}
    errors.update({f"upstream {k}": n for k, n in sorted(now.upstream_errors.items())})
    return errors


def _engine_cells(name: str, e: EngineRow) -> tuple[str, ...]:
    up = "-" if e.up is None else ("yes" if e.up >= 1 else "NO")
    kv = "-" if e.kv_usage is None else f"{e.kv_usage * 100:.1f}%"
    if e.capacity:
        held = f"{_num(e.reserved or 0)}/{_num(e.capacity)}"
    else:
        held = "-" if e.reserved is None else f"{_num(e.reserved)}/-"
    hit = "-" if e.hit_ratio is None else f"{e.hit_ratio:.3f}"
    return (name, up, kv, held, _num(e.running), _num(e.waiting), hit, _num(e.preemptions),
            _num(e.requests))  # fmt: skip


def _row(cells: tuple[str, ...]) -> str:
    return "  ".join(c[:w].ljust(w) for c, w in zip(cells, _WIDTHS, strict=True)).rstrip()


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if value == int(value):
        return str(int(value))
    return f"{value:.2f}"


def _prompt(hist: Histogram | None, stage: str) -> str:
    if hist is None or hist.count <= 0:
        return f"{stage}: -"
    p50, top = hist.quantile(0.5), hist.top()
    return f"{stage}: p50 <= {_bound(p50)}, max <= {_bound(top)} ({_num(hist.count)})"


def _bound(value: float | None) -> str:
    if value is None:
        return "-"
    return "inf" if math.isinf(value) else _num(value)
