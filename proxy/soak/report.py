"""``report.html`` (one page, readable offline) and ``report.png`` (its main figure).

The main figure puts, per arm, the prompt tokens forwarded per request and the
engine's KV-cache usage on one time axis: a bounded proxy shows a flat band (or a
sawtooth, with session limits) under a flat KV curve; an unbounded client shows both
rising until the engine refuses or preempts. A second figure holds what explains the
first: preemptions and waiting requests, latency, and GPU memory where it was
sampled. The arms share their axes' scales so that they compare at a glance. A run
that sampled several engines gets their own curves too (``engines``), in the page and
under the main figure in report.png.

Figures are drawn with matplotlib's Agg canvas on ``Figure`` objects (no pyplot, so
no global state) and inlined into the page as SVG.
"""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure, SubFigure

from proxy.soak.engines import draw_engines, engine_names, engines_figure, engines_table
from proxy.soak.records import RequestRecord, Sample
from proxy.soak.summary import SCALAR_FIELDS

_PROMPT, _SENT, _KV, _ERR, _WAIT, _PRE = (
    "#1f77b4",
    "#aec7e8",
    "#ff7f0e",
    "#d62728",
    "#9467bd",
    "#8c564b",
)


#: Samples in the KV trend line's trailing mean: 5 s at 0.5 s a sample.
_TREND_SAMPLES = 10


def _trailing_mean(values: Sequence[float], window: int) -> list[float]:
    out: list[float] = []
    total = 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _conversations(records: Sequence[RequestRecord]) -> list[list[tuple[float, int]]]:
    """Each conversation's forwarded sizes in time order (a lane's restart is a new one)."""
    lines: dict[tuple[int, int], list[tuple[float, int]]] = {}
    for r in sorted(records, key=lambda r: r.start):
        if r.ok and r.forwarded_prompt_tokens is not None:
            lines.setdefault((r.conversation, r.restart), []).append(
                (r.start, r.forwarded_prompt_tokens)
            )
    return [points for points in lines.values() if len(points) > 1]


def _arms(records: Sequence[RequestRecord], samples: Sequence[Sample]) -> list[str]:
    present = {r.arm for r in records} | {s.arm for s in samples}
    return [name for name in ("target", "compare") if name in present]


def _kv_axis(ax: Axes, samples: Sequence[Sample]) -> None:
    twin = ax.twinx()
    points = [(s.t, s.kv_usage * 100) for s in samples if s.kv_usage is not None]
    if points:
        times, usage = zip(*points, strict=True)
        # Every sample, faint; over it the mean of the last few seconds, which is the
        # trend a reader looks for (flat, sawtooth, rising) without the batch rhythm.
        twin.fill_between(times, usage, color=_KV, alpha=0.18, linewidth=0)
        twin.plot(
            times,
            _trailing_mean(usage, _TREND_SAMPLES),
            color=_KV,
            linewidth=1.8,
            label="KV-cache usage",
        )
    twin.set_ylim(0, 105)
    twin.set_ylabel("KV-cache usage (%, 5 s mean)", color=_KV)
    twin.tick_params(axis="y", colors=_KV)


def main_figure(
    records: Sequence[RequestRecord], samples: Sequence[Sample], titles: dict[str, str]
) -> Figure:
    fig = Figure(figsize=(6.4 * max(1, len(_arms(records, samples))), 4.2), layout="constrained")
    draw_main(fig, records, samples, titles)
    return fig


def draw_main(
    fig: Figure | SubFigure,
    records: Sequence[RequestRecord],
    samples: Sequence[Sample],
    titles: dict[str, str],
) -> None:
    arms = _arms(records, samples)
    axes = fig.subplots(1, max(1, len(arms)), sharey=True, squeeze=False)[0]
    for ax, arm in zip(axes, arms, strict=False):
        mine = [r for r in records if r.arm == arm]
        sent = [(r.start, r.sent_prompt_tokens) for r in mine if r.sent_prompt_tokens is not None]
        if sent and any(r.sent_prompt_tokens != r.forwarded_prompt_tokens for r in mine):
            ax.scatter(*zip(*sent, strict=True), s=6, color=_SENT, label="sent by the client")
        fwd = [(r.start, r.forwarded_prompt_tokens) for r in mine if r.ok]
        fwd = [(t, n) for t, n in fwd if n is not None]
        if fwd:
            ax.scatter(*zip(*fwd, strict=True), s=8, color=_PROMPT, label="forwarded to the engine")
        # One thin line per conversation: its growth, cuts and resets read as a shape.
        for points in _conversations(mine):
            ax.plot(*zip(*points, strict=True), color=_PROMPT, linewidth=0.6, alpha=0.5)
        failed = [r.start for r in mine if not r.ok]
        if failed:
            ax.scatter(failed, [0] * len(failed), marker="x", s=18, color=_ERR, label="failed")
        ax.set_title(titles.get(arm, arm), fontsize=10)
        ax.set_xlabel("seconds since the arm started")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
        _kv_axis(ax, [s for s in samples if s.arm == arm])
    axes[0].set_ylabel("prompt tokens per request")
    axes[0].set_ylim(bottom=0)


def detail_figure(
    records: Sequence[RequestRecord], samples: Sequence[Sample], titles: dict[str, str]
) -> Figure:
    arms = _arms(records, samples)
    gpu = any(s.gpu_memory_used_mib for s in samples)
    rows = 3 if gpu else 2
    fig = Figure(figsize=(6.4 * max(1, len(arms)), 3.0 * rows), layout="constrained")
    grid = fig.subplots(rows, max(1, len(arms)), sharex="col", sharey="row", squeeze=False)
    for col, arm in enumerate(arms):
        mine = [s for s in samples if s.arm == arm]
        top, mid = grid[0][col], grid[1][col]
        first = next((s.preemptions_total for s in mine if s.preemptions_total is not None), None)
        pre = [
            (s.t, s.preemptions_total - first)
            for s in mine
            if s.preemptions_total is not None and first is not None
        ]
        if pre:
            top.step(*zip(*pre, strict=True), where="post", color=_PRE, label="preemptions")
        wait = [(s.t, s.waiting) for s in mine if s.waiting is not None]
        if wait:
            top.plot(*zip(*wait, strict=True), color=_WAIT, label="waiting requests")
        top.set_title(titles.get(arm, arm), fontsize=10)
        top.legend(loc="upper left", fontsize=8)
        top.grid(alpha=0.3)
        ok = [r for r in records if r.arm == arm and r.ok]
        if ok:
            mid.scatter(
                [r.start for r in ok],
                [r.latency_seconds for r in ok],
                s=6,
                color=_PROMPT,
                label="latency",
            )
            ttft = [(r.start, r.ttft_seconds) for r in ok if r.ttft_seconds is not None]
            if ttft:
                mid.scatter(*zip(*ttft, strict=True), s=6, color=_KV, label="time to first token")
            mid.legend(loc="upper left", fontsize=8)
        mid.grid(alpha=0.3)
        if gpu:
            cards = [(s.t, s.gpu_memory_used_mib) for s in mine if s.gpu_memory_used_mib]
            for card in range(max((len(c) for _, c in cards), default=0)):
                points = [(t, c[card]) for t, c in cards if card < len(c)]
                grid[2][col].plot(*zip(*points, strict=True), label=f"GPU {card}")
            grid[2][col].legend(loc="upper left", fontsize=8)
            grid[2][col].grid(alpha=0.3)
        grid[rows - 1][col].set_xlabel("seconds since the arm started")
    grid[0][0].set_ylabel("count")
    grid[1][0].set_ylabel("seconds")
    if gpu:
        grid[2][0].set_ylabel("GPU memory used (MiB)")
    return fig


def _svg(fig: Figure) -> str:
    buffer = io.StringIO()
    FigureCanvasAgg(fig)
    fig.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.find("<svg") :]  # drop the XML prologue and doctype: inlined


def _table(summary: dict[str, Any]) -> str:
    arms = [name for name in ("target", "compare") if summary.get(name)]
    head = "".join(f"<th>{html.escape(a)}</th>" for a in arms)
    rows = []
    for field in SCALAR_FIELDS:
        cells = "".join(f"<td>{html.escape(_cell(summary[a][field]))}</td>" for a in arms)
        rows.append(f"<tr><th>{field}</th>{cells}</tr>")
    return f"<table><tr><th></th>{head}</tr>{''.join(rows)}</table>"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items()) or "none"
    return str(value)


def _pairs(data: dict[str, Any]) -> str:
    items = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_cell(v))}</td></tr>"
        for k, v in data.items()
    )
    return f"<table>{items}</table>"


_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1400px; color: #222; }
table { border-collapse: collapse; margin: .5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: right; }
th { background: #f4f4f4; text-align: left; }
.verdict { padding: .5em 1em; border-radius: 4px; display: inline-block; }
.pass { background: #e6f4ea; } .fail { background: #fce8e6; }
svg { max-width: 100%; height: auto; }
"""


_ENGINES_TEXT = """<p>Each engine's own curves (by the proxy's <code>engine</code> label,
host:port); the figures above fold them (KV usage: the fullest engine; counts: summed). The
hit ratio counts from the arm's start; the cluster's is the engines' hits over their
queries, summed.</p>"""


def _png(
    path: Path,
    records: Sequence[RequestRecord],
    samples: Sequence[Sample],
    titles: dict[str, str],
    several: bool,
) -> None:
    """The main figure; with several engines, their curves under it."""
    arms = _arms(records, samples)
    if not several:
        fig = main_figure(records, samples, titles)
    else:
        fig = Figure(figsize=(6.4 * max(1, len(arms)), 11.7), layout="constrained")
        parts = fig.subfigures(2, 1, squeeze=False, height_ratios=[4.2, 7.5])
        top, bottom = parts[0][0], parts[1][0]
        draw_main(top, records, samples, titles)
        draw_engines(bottom, samples, arms, titles)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110)


def write_report(
    out: Path,
    summary: dict[str, Any],
    run: dict[str, Any],
    records: Sequence[RequestRecord],
    samples: Sequence[Sample],
    reasons: Sequence[str],
) -> None:
    titles = {name: f"{name}: {run[name]}" for name in ("target", "compare") if run.get(name)}
    several = len(engine_names(samples)) > 1
    _png(out / "report.png", records, samples, titles, several)
    main_svg = _svg(main_figure(records, samples, titles))
    engines = ""
    if several:
        svg = _svg(engines_figure(samples, _arms(records, samples), titles))
        engines = f"<h2>Engines</h2>{_ENGINES_TEXT}{svg}{engines_table(summary)}"
    detail_svg = _svg(detail_figure(records, samples, titles))
    verdict = (
        '<p class="verdict fail">exit 1: ' + html.escape("; ".join(reasons)) + "</p>"
        if reasons
        else '<p class="verdict pass">exit 0: the target arm had no errors'
        + (" and stayed under --max-kv-usage" if run.get("max_kv_usage") is not None else "")
        + "</p>"
    )
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>trimproxy soak</title>
<style>{_STYLE}</style></head><body>
<h1>trimproxy soak</h1>
{verdict}
<h2>Prompt tokens and KV-cache usage</h2>
<p>Each dot is one request, at the time it was sent: the prompt tokens that reached the engine
(light: what the client sent, where the proxy cut it). The line is the engine's KV-cache usage.
Flat means bounded; a sawtooth is session resets; a rising curve grows until the engine
refuses (red crosses) or preempts.</p>
{main_svg}
<h2>Preemptions, waiting requests, latency</h2>
{detail_svg}
{engines}
<h2>Summary</h2>
{_table(summary)}
<h2>Engine</h2>
{_pairs(summary["engine"])}
<h2>Run</h2>
{_pairs(run)}
<p>Raw data next to this page: requests.jsonl, samples.jsonl, summary.json.</p>
</body></html>
"""
    (out / "report.html").write_text(page, encoding="utf-8")
