"""The issue's targets, evaluated on a run, and the printed tables."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from bench.compare.trimmers import DIAGNOSTIC, TIMING_ONLY


def targets(result: dict[str, Any]) -> dict[str, Any]:
    """Speed compares process CPU time: on a shared machine wall time measures the
    neighbours too. "The faster peer" is the fastest configuration a user of a peer
    can run as shipped; the diagnostic and timing-only variants are context, not
    competitors."""
    out: dict[str, Any] = {}
    timing = result["timing"]
    if "trimproxy" in result["sweep"]:
        total = result["sweep"]["trimproxy"]["total"]
        out["trimproxy_zero_violations"] = total["any_violation"] == 0
    peers = [
        n
        for n in result["sweep"]
        if n != "trimproxy" and n not in TIMING_ONLY and n not in DIAGNOSTIC
    ]
    if "trimproxy" in timing and peers:
        speedup: dict[str, dict[str, float]] = {}
        for s in timing["trimproxy"]:
            speedup[s] = {}
            for mode in ("cold", "warm"):
                ours = timing["trimproxy"][s][mode]["cpu_median_ms"]
                fastest = min(timing[p][s][mode]["cpu_median_ms"] for p in peers)
                speedup[s][mode] = round(fastest / max(ours, 1e-6), 1)
        out["speedup_vs_fastest_peer_cpu"] = speedup
        out["speedup_30x_warm"] = all(v["warm"] >= 30 for v in speedup.values())
        out["speedup_30x_cold"] = all(v["cold"] >= 30 for v in speedup.values())
    reuse = result["reuse"]["by_trimmer"]
    if "trimproxy" in reuse:
        out["trimproxy_reuse_ge_0.9"] = reuse["trimproxy"]["reuse"] >= 0.9
        out["peers_reuse_lt_0.9"] = all(
            v["reuse"] < 0.9 for n, v in reuse.items() if not n.startswith("trimproxy")
        )
    return out


def fmt_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [
        "  ".join(
            c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _ms(t: dict[str, float] | None, key: str, digits: int) -> str:
    return "-" if t is None else f"{t[key]:.{digits}f}"


def report(result: dict[str, Any]) -> str:
    parts = []
    m = result["machine"]
    load = result["load_average"]
    parts.append(
        f"machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, load average "
        f"{load['before'][0]:.1f} before / {load['after'][0]:.1f} after\n"
        f"counter {result['counter']}; budget {result['budget']}; "
        + ", ".join(f"{k} {v}" for k, v in result["versions"].items())
    )
    shapes = result["shapes"]
    parts.append(
        fmt_table(
            ["shape", "messages", "tokens", "litellm's count"],
            [
                [s, v["messages"], v["tokens"], v.get("litellm_tokens", "-")]
                for s, v in shapes.items()
            ],
        )
    )
    rows = []
    for name, per in result["timing"].items():
        for s, t in per.items():
            cold, warm = t.get("cold"), t["warm"]
            rows.append(
                [
                    name,
                    s,
                    _ms(cold, "cpu_median_ms", 2),
                    _ms(cold, "cpu_p90_ms", 2),
                    _ms(warm, "cpu_median_ms", 3),
                    _ms(warm, "cpu_p90_ms", 3),
                    _ms(cold, "median_ms", 2),
                    _ms(warm, "median_ms", 3),
                ]
            )
    parts.append(
        f"time per call at budget {result['budget']}, ms "
        "(CPU time of the process; wall time alongside)\n"
        + fmt_table(
            [
                "trimmer",
                "shape",
                "cold med",
                "cold p90",
                "warm med",
                "warm p90",
                "wall cold",
                "wall warm",
            ],
            rows,
        )
    )
    b0, b1, step = result["sweep_budgets"]
    rows = []
    for name, sw in result["sweep"].items():
        t = sw["total"]
        rows.append(
            [
                name,
                t["budgets"],
                t["any_violation"],
                t["over_budget"],
                t["max_over_tokens"],
                t["altered"],
                t["orphaned"],
                t["non_user_start"],
                t["system_lost"],
                t["last_user_lost"],
                t["refused"],
                t["caught_errors"],
            ]
        )
    parts.append(
        f"budget sweep {b0}..{b1} step {step} x {len(shapes)} shapes: runs with each violation\n"
        + fmt_table(
            [
                "trimmer",
                "runs",
                "any",
                "over",
                "max over",
                "altered",
                "orphaned",
                "non-user 1st",
                "sys lost",
                "last user lost",
                "refused",
                "caught err",
            ],
            rows,
        )
    )
    rows = [
        [n, *(sw["by_shape"][s]["any_violation"] for s in shapes)]
        for n, sw in result["sweep"].items()
    ]
    parts.append("runs with any violation, by shape\n" + fmt_table(["trimmer", *shapes], rows))
    errors = {n: sw["errors"] for n, sw in result["sweep"].items() if sw["errors"]}
    if errors:
        parts.append("errors caught inside the trimmer: " + json.dumps(errors))
    ru = result["reuse"]
    rows = [
        [
            n,
            f"{v['reuse']:.3f}",
            f"{v['ceiling']:.3f}",
            f"{v['mean_share']:.3f}",
            f"{v['stable']:.3f}",
            f"{v['fill']:.3f}",
            v["pairs"],
            v["refused"],
        ]
        for n, v in ru["by_trimmer"].items()
    ]
    parts.append(
        f"prefix reuse, {ru['conversation']} ({ru['messages']} messages, "
        f"{ru['tokens']} tokens at the end), budget {result['budget']}\n"
        + fmt_table(
            ["trimmer", "reuse", "ceiling", "mean share", "stable", "fill", "pairs", "refused"],
            rows,
        )
    )
    parts.append("targets: " + json.dumps(result["targets"]))
    parts.append(f"elapsed {result['elapsed_s']} s")
    return "\n\n".join(parts)
