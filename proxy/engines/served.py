"""What several engines of one setting serve, as one list.

Engines behind one ``TRIMPROXY_UPSTREAM_URL`` are meant to serve the same models. The
proxy's list is their union (first engine's entry first); where engines disagree on
a model's ``max_model_len`` the smallest is kept, so the budget fits every engine a
request may be routed to, and the disagreement is logged as a warning: such engines
are not interchangeable, and the operator should know.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

log = logging.getLogger("trimproxy.engines")


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One entry of an engine's ``/v1/models``: vLLM names the model's path or id
    as ``root`` and reports ``max_model_len``; FastChat gives only ``id``."""

    id: str
    root: str | None = None
    max_model_len: int | None = None


def merge_served(
    lists: Sequence[tuple[str, Sequence[ServedModel]]], said: set[tuple[str, str]] | None = None
) -> tuple[ServedModel, ...]:
    """The union of each engine's ``(label, models)``; ``said`` remembers the
    disagreements already logged (one warning each)."""
    merged: dict[str, ServedModel] = {}
    lengths: dict[str, dict[str, int | None]] = {}
    for label, models in lists:
        for model in models:
            lengths.setdefault(model.id, {})[label] = model.max_model_len
            known = merged.get(model.id)
            if known is None:
                merged[model.id] = model
            elif model.max_model_len is not None and (
                known.max_model_len is None or model.max_model_len < known.max_model_len
            ):
                merged[model.id] = replace(known, max_model_len=model.max_model_len)
    for name, by_engine in lengths.items():
        values = set(by_engine.values())
        if len(values) > 1:
            shown = ", ".join(f"{label}: {v}" for label, v in sorted(by_engine.items()))
            key = (name, shown)
            if said is None or key not in said:
                if said is not None:
                    said.add(key)
                log.warning(
                    "the engines of one upstream disagree on max_model_len of model %r (%s); "
                    "budgets use the smallest. Engines behind one TRIMPROXY_UPSTREAM_URL must "
                    "serve the same model with the same --max-model-len",
                    name[:100],
                    shown,
                )
    return tuple(merged.values())
