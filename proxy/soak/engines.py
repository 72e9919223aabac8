"""The report's per-engine part: each engine's curves and its figures, for a soak
against a proxy that routes over several engines.

One column per arm, three rows on one time axis: KV-cache usage, running and waiting
requests, and the prefix-cache hit ratio since the arm started (each engine's, and the
cluster's: the sum of the engines' hits over the sum of their queries). Session routing
shows as even KV curves and hit ratios that stay up on every engine; round robin as
hit ratios that collapse.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure, SubFigure

from proxy.soak.records import EngineFigures, Sample
from proxy.soak.summary import ENGINE_SUMMARY_FIELDS

_CLUSTER = "#222222"


def engine_names(samples: Sequence[Sample]) -> list[str]:
    """Every engine the samples name, in the order first seen."""
    names: dict[str, None] = {}
    for s in samples:
        names.update(dict.fromkeys(s.engines or {}))
    return list(names)


def _series(samples: Sequence[Sample], engine: str) -> list[tuple[float, EngineFigures]]:
    return [
        (s.t, s.engines[engine])
        for s in samples
        if s.engines and engine in s.engines and "error" not in s.engines[engine]
    ]


class _Growth:
    """A counter's increase since the first value seen; a drop (restart) counts its
    new value, as the summary does."""

    def __init__(self) -> None:
        self.last: float | None = None
        self.total = 0.0

    def add(self, value: float) -> float:
        if self.last is not None:
            self.total += value - self.last if value >= self.last else value
        self.last = value
        return self.total


def hit_ratio_curves(
    samples: Sequence[Sample], engines: Sequence[str]
) -> dict[str, list[tuple[float, float]]]:
    """Hit ratio since the arm started, per engine and (key ``""``) for the cluster."""
    curves: dict[str, list[tuple[float, float]]] = {name: [] for name in ("", *engines)}
    hits = {name: _Growth() for name in engines}
    queries = {name: _Growth() for name in engines}
    for s in samples:
        for name, entry in (s.engines or {}).items():
            h, q = entry.get("prefix_cache_hits_total"), entry.get("prefix_cache_queries_total")
            if name not in hits or "error" in entry or h is None or q is None:
                continue
            grown_h, grown_q = hits[name].add(h), queries[name].add(q)
            if grown_q > 0:
                curves[name].append((s.t, grown_h / grown_q))
        total_q = sum(g.total for g in queries.values())
        if total_q > 0:
            curves[""].append((s.t, sum(g.total for g in hits.values()) / total_q))
    return curves


def _column(rows: Sequence[Any], samples: Sequence[Sample], engines: Sequence[str]) -> None:
    kv_ax, load_ax, hit_ax = rows
    colors = {name: f"C{i % 10}" for i, name in enumerate(engines)}
    for name in engines:
        points = _series(samples, name)
        kv = [(t, f["kv_usage"] * 100) for t, f in points if f.get("kv_usage") is not None]
        if kv:
            kv_ax.plot(*zip(*kv, strict=True), color=colors[name], linewidth=1.2, label=name)
        running = [(t, f["running"]) for t, f in points if f.get("running") is not None]
        if running:
            load_ax.plot(
                *zip(*running, strict=True),
                color=colors[name],
                linewidth=1.2,
                label=f"{name} running",
            )
        waiting = [(t, f["waiting"]) for t, f in points if f.get("waiting") is not None]
        if waiting and any(w for _, w in waiting):
            load_ax.plot(
                *zip(*waiting, strict=True),
                color=colors[name],
                linewidth=1.0,
                linestyle="--",
                label=f"{name} waiting",
            )
    curves = hit_ratio_curves(samples, engines)
    for name in (*engines, ""):  # the cluster last, on top, dashed: one engine hides it not
        if curves[name]:
            hit_ax.plot(
                *zip(*curves[name], strict=True),
                color=colors.get(name, _CLUSTER),
                linewidth=1.2,
                linestyle="--" if not name else "-",
                label=name or "cluster",
            )
    kv_ax.set_ylim(0, 105)
    hit_ax.set_ylim(0, 1.05)
    for ax in rows:
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=7)


def draw_engines(
    fig: Figure | SubFigure, samples: Sequence[Sample], arms: Sequence[str], titles: dict[str, str]
) -> None:
    """The per-engine rows into ``fig`` (a figure, or the lower part of report.png)."""
    engines = engine_names(samples)
    grid = fig.subplots(3, max(1, len(arms)), sharex="col", sharey="row", squeeze=False)
    for col, arm in enumerate(arms):
        _column([grid[r][col] for r in range(3)], [s for s in samples if s.arm == arm], engines)
        grid[0][col].set_title(f"per engine, {titles.get(arm, arm)}", fontsize=10)
        grid[2][col].set_xlabel("seconds since the arm started")
    grid[0][0].set_ylabel("KV-cache usage (%)")
    grid[1][0].set_ylabel("requests")
    grid[2][0].set_ylabel("prefix-cache hit ratio\nsince the arm started")


def engines_figure(
    samples: Sequence[Sample], arms: Sequence[str], titles: dict[str, str]
) -> Figure:
    fig = Figure(figsize=(6.4 * max(1, len(arms)), 7.5), layout="constrained")
    draw_engines(fig, samples, arms, titles)
    return fig


def engines_table(summary: dict[str, Any]) -> str:
    """Per arm, one row per engine, and the cluster's hit ratio under it."""
    parts = []
    for arm in ("target", "compare"):
        figures = summary.get(arm) or {}
        engines: dict[str, dict[str, Any]] = figures.get("engines") or {}
        if not engines:
            continue
        head = "".join(f"<th>{f}</th>" for f in ENGINE_SUMMARY_FIELDS)
        rows = "".join(
            f"<tr><th>{html.escape(name)}</th>"
            + "".join(f"<td>{_cell(values[f])}</td>" for f in ENGINE_SUMMARY_FIELDS)
            + "</tr>"
            for name, values in engines.items()
        )
        cluster = _cell(figures.get("prefix_cache_hit_ratio"))
        parts.append(
            f"<h3>{html.escape(arm)}</h3><p>Cluster prefix-cache hit ratio (the engines' "
            f"hits over their queries, summed): <b>{cluster}</b></p>"
            f"<table><tr><th>engine</th>{head}</tr>{rows}</table>"
        )
    return "".join(parts)


def _cell(value: Any) -> str:
    return "-" if value is None else html.escape(str(value))
