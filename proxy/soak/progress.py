"""What the terminal shows: a progress bar per arm while it runs (requests, errors,
the engine's current KV usage), and the two arms side by side at the end.

Drawn on stderr with rich, so stdout stays free for the path of the results.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from proxy.soak.options import Arm, SoakOptions
from proxy.soak.records import RequestRecord, Sample
from proxy.soak.summary import SCALAR_FIELDS


class SoakProgress:
    def __init__(self, options: SoakOptions, console: Console) -> None:
        self.options = options
        self.console = console
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[requests]} requests"),
            TextColumn("[red]{task.fields[errors]} errors"),
            TextColumn("KV {task.fields[kv]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self.task: TaskID | None = None
        self.requests = self.errors = 0
        self.started = 0.0

    def __enter__(self) -> SoakProgress:
        self.progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.progress.stop()

    def start_arm(self, arm: Arm) -> None:
        turns, duration = self.options.turns, self.options.duration
        total = self.options.conversations * turns if turns else duration
        self.requests = self.errors = 0
        self.started = time.monotonic()
        self.task = self.progress.add_task(
            f"{arm.name} {arm.url}", total=total, requests=0, errors=0, kv="-"
        )

    def on_record(self, record: RequestRecord) -> None:
        self.requests += 1
        self.errors += 0 if record.ok else 1
        if self.task is None:
            return
        self.progress.update(self.task, requests=self.requests, errors=self.errors)
        if self.options.turns:
            self.progress.advance(self.task)

    def on_sample(self, sample: Sample) -> None:
        if self.task is None:
            return
        kv = "-" if sample.kv_usage is None else f"{sample.kv_usage:.0%}"
        self.progress.update(self.task, kv=kv)
        if not self.options.turns:
            self.progress.update(self.task, completed=time.monotonic() - self.started)

    def finish_arm(self) -> None:
        if self.task is not None:
            total = self.progress.tasks[-1].total
            self.progress.update(self.task, completed=total)
        self.task = None


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items()) or "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def summary_table(summary: dict[str, Any]) -> Table:
    arms = [name for name in ("target", "compare") if summary.get(name)]
    table = Table(title="trimproxy soak")
    table.add_column("")
    for name in arms:
        table.add_column(name, justify="right")
    for field in SCALAR_FIELDS:
        table.add_row(field, *(_shown(summary[name][field]) for name in arms))
    engine = ", ".join(f"{k} {_shown(v)}" for k, v in summary["engine"].items())
    table.caption = f"engine: {engine}"
    return table
