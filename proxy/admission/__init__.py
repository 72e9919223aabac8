"""KV admission (docs/architecture.md §11): a ledger of the engine's KV tokens, FIFO, shared.

Each chat request reserves what it can hold, ``forwarded prompt + n x completion
allowance`` (``need``, ``allowance``), before it is forwarded and gives it back when its
answer ends, fails or its client leaves, so the sum of what is in the engine stays under
its capacity; a streamed answer that outgrows its reservation grows it (``overrun``).
``build_admission`` makes the gate from the settings (None when
``TRIMPROXY_KV_ADMISSION=off``).
"""

from __future__ import annotations

import logging

from proxy.admission.capacity import Capacity, EngineCache, parse_cache_config, scaled
from proxy.admission.gate import WAIT_HEADER, KvAdmission, wait_header
from proxy.admission.ledger import (
    AdmissionTimeout,
    Ledger,
    LedgerUnavailable,
    MemoryLedger,
    Reservation,
)
from proxy.admission.need import Need
from proxy.admission.overrun import (
    CHAT_ANSWER,
    MESSAGES_ANSWER,
    RESPONSES_ANSWER,
    AnswerShape,
    AnswerWatch,
    asks_usage,
)
from proxy.metrics import Metrics
from proxy.settings import Settings

__all__ = [
    "CHAT_ANSWER",
    "MESSAGES_ANSWER",
    "RESPONSES_ANSWER",
    "WAIT_HEADER",
    "AdmissionTimeout",
    "AnswerShape",
    "AnswerWatch",
    "Capacity",
    "EngineCache",
    "KvAdmission",
    "Ledger",
    "LedgerUnavailable",
    "MemoryLedger",
    "Need",
    "Reservation",
    "asks_usage",
    "build_admission",
    "parse_cache_config",
    "scaled",
    "wait_header",
]

log = logging.getLogger("trimproxy.admission")


def build_admission(
    settings: Settings, metrics: Metrics, engine_url: str | None = None, label: str | None = None
) -> KvAdmission | None:
    """The gate of one engine (``engine_url``, labelled ``label`` in the metrics; the
    setting's URL by default), or None when admission is off. Each engine has its own
    ledger and capacity (docs/engines.md).

    Without Redis each worker process holds its own ledger, so each gets its share of
    the capacity: ÷ (TRIMPROXY_KV_ADMISSION_REPLICAS x TRIMPROXY_WORKERS). With Redis the
    ledger is one for all; that share is only the fallback while Redis is down.
    """
    setting = settings.kv_admission
    if setting == "off":
        return None
    fixed = None if setting == "auto" else int(setting)
    if fixed is None and settings.upstream_metrics_interval <= 0:
        log.warning(
            "TRIMPROXY_KV_ADMISSION=auto reads the engine's capacity from its /metrics, but "
            "TRIMPROXY_UPSTREAM_METRICS_INTERVAL=0 turns that scrape off: admission stays off"
        )
    share = settings.kv_admission_replicas * settings.workers
    engine_url = engine_url if engine_url is not None else settings.upstream_url
    ledger: Ledger
    if settings.redis_url:
        from proxy.admission.redis_ledger import RedisLedger  # redis only when used

        ledger = RedisLedger(
            settings.redis_url,
            engine_url,  # the keys are the engine's: one ledger per engine
            MemoryLedger(None),
            share=share,
            failure=settings.session_store_failure,
        )
    else:
        ledger = _Shared(share)
    gate = KvAdmission(
        ledger,
        metrics,
        mode="auto" if fixed is None else "fixed",
        fraction=settings.kv_admission_fraction,
        timeout=settings.admission_timeout,
        fixed_tokens=fixed,
        engine=label,
    )
    log.info(
        "KV admission on %s (%s, fraction %g, timeout %g s, ledger %s%s)",
        label or engine_url,
        setting if fixed is None else f"{fixed} tokens",
        settings.kv_admission_fraction,
        settings.admission_timeout,
        ledger.name,
        f", 1/{share} of the capacity per process" if ledger.name == "memory" and share > 1 else "",
    )
    return gate


class _Shared(MemoryLedger):
    """A per-process ledger holding this process's share of the capacity."""

    def __init__(self, share: int) -> None:
        super().__init__(None)
        self.share = share

    def set_capacity(self, capacity: Capacity | None) -> None:
        if capacity is not None and self.share > 1:
            tokens = max(capacity.tokens // self.share, capacity.block_size)
            capacity = Capacity(tokens - tokens % capacity.block_size, capacity.block_size)
        super().set_capacity(capacity)
