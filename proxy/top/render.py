"""A ``Window`` as lines of text: the engines' table, the proxy's own figures, then one
row per endpoint (the API the prompts came in by) that has had any.

The same lines serve the live screen (redrawn in place on a terminal) and the log
(``--once``, or output that is not a terminal): plain text, no colour, so that a line
read in a log file says what the screen said.
"""

from __future__ import annotations

import math

from proxy.metrics import ENDPOINTS
from proxy.top.snapshot import EndpointRow, EngineRow, Histogram, Window

_COLUMNS = (
    "engine",
    "up",
    "kv use",
    "reserved/capacity",
    "run",
    "wait",
    "hit ratio",
    "preempt",
    "requests",
)
_WIDTHS = (24, 4, 7, 19, 5, 5, 10, 8, 9)
# Prompt lengths to the histogram's bucket: "<=512" reads "at most 512 tokens".
_ENDPOINT_COLUMNS = (
    "endpoint",
    "prompts",
    "received p50",
    "max",
    "forwarded p50",
    "max",
    "trims",
    "resets",
    "rejected",
)
_ENDPOINT_WIDTHS = (12, 9, 13, 8, 14, 8, 7, 8, 8)
_ORDER = ENDPOINTS


def lines(view: Window, url: str) -> list[str]:
    """The screen for ``view`` of the proxy at ``url``."""
    out = [f"trimproxy top — {url}   (every figure from its /metrics)", ""]
    out.append(_row(_COLUMNS))
    for name, engine in sorted(view.now.engines.items()):
        out.append(_row(_engine_cells(name, engine)))
    out.append("")
    out.append(
        "prompt tokens   "
        + _prompt(view.prompt.get("received"), "received")
        + "   "
        + _prompt(view.prompt.get("forwarded"), "forwarded")
    )
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
    return out + _endpoints(view)


def _endpoints(view: Window) -> list[str]:
    """The endpoint table: its rows in the label's order, each endpoint that has had a
    prompt, a trim, a session reset or a refusal since the proxy started."""
    seen = [name for name, row in view.now.endpoints.items() if _any(row)]
    if not seen:
        return []
    seen.sort(key=lambda n: (_ORDER.index(n), n) if n in _ORDER else (len(_ORDER), n))
    suffix = "/s" if view.seconds else ""
    # Rates as on the line above: prompts, trims and resets; admission refusals in total.
    heads = tuple(
        h + suffix if h in ("prompts", "trims", "resets") else h for h in _ENDPOINT_COLUMNS
    )
    out = ["", _row(heads, _ENDPOINT_WIDTHS)]
    for name in seen:
        row = view.endpoints[name]
        received, forwarded = row.prompt.get("received"), row.prompt.get("forwarded")
        prompts = received.count if received is not None else 0.0
        cells = (
            name,
            _num(prompts / view.seconds if view.seconds else prompts),
            *_lengths(received),
            *_lengths(forwarded),
            _num(row.trims),
            _num(row.session_resets),
            _num(view.now.endpoints[name].admission_rejected),
        )
        out.append(_row(cells, _ENDPOINT_WIDTHS))
    return out


def _any(row: EndpointRow) -> bool:
    counted = any(h.count > 0 for h in row.prompt.values())
    return counted or bool(row.trims or row.session_resets or row.admission_rejected)


def _lengths(hist: Histogram | None) -> tuple[str, str]:
    """The window's p50 and max prompt length, to the bucket."""
    if hist is None or hist.count <= 0:
        return "-", "-"
    return f"<={_bound(hist.quantile(0.5))}", f"<={_bound(hist.top())}"


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
    return (
        name,
        up,
        kv,
        held,
        _num(e.running),
        _num(e.waiting),
        hit,
        _num(e.preemptions),
        _num(e.requests),
    )


def _row(cells: tuple[str, ...], widths: tuple[int, ...] = _WIDTHS) -> str:
    return "  ".join(c[:w].ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


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
