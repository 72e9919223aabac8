"""Everything one running sim knows: config, KV cache, recordings, counters, knobs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from proxy.sim.clock import Clock, WallClock
from proxy.sim.config import SimConfig
from proxy.sim.dialect import Dialect
from proxy.sim.fastchat import FastChat
from proxy.sim.kv import KVCache
from proxy.sim.recorder import Record, Recorder
from proxy.sim.vllm import VLLM


def dialect_for(name: str) -> Dialect:
    """The wire format the sim speaks, by ``SimConfig.dialect``."""
    if name == "vllm":
        return VLLM()
    if name == "fastchat":
        return FastChat()
    raise ValueError(f"unknown dialect {name!r}")


@dataclass
class FailRule:
    """``POST /_sim/config {"fail_next": {...}}``: answer the next matching requests
    with this instead of the real answer."""

    status: int = 500
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    times: int = 1
    #: Only requests to this path; None matches every path except the sim's own,
    #: /metrics and /health (a proxy's background scrape must not eat the failure).
    path: str | None = "/v1/chat/completions"
    #: Drop the connection without any answer (an upstream that crashed).
    close: bool = False
    #: Seconds to wait before failing.
    delay_seconds: float = 0.0

    @classmethod
    def parse(cls, raw: Any) -> FailRule:
        if not isinstance(raw, dict):
            raise ValueError("fail_next must be an object")
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"fail_next: unknown keys {', '.join(sorted(unknown))}")
        rule = cls(**raw)
        rule.status, rule.times = int(rule.status), int(rule.times)
        rule.delay_seconds = float(rule.delay_seconds)
        if not 100 <= rule.status <= 599 or rule.times < 1 or rule.delay_seconds < 0:
            raise ValueError("fail_next: status must be 100-599, times >= 1, delay >= 0")
        if not isinstance(rule.headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in rule.headers.items()
        ):
            raise ValueError("fail_next: headers must map strings to strings")
        return rule

    def matches(self, path: str) -> bool:
        if self.path is not None:
            return path == self.path
        return path not in ("/metrics", "/health")


class SimState:
    def __init__(self, config: SimConfig, clock: Clock | None = None) -> None:
        self.base_config = config
        self.config = config
        self.clock: Clock = clock if clock is not None else WallClock()
        self.dialect: Dialect = dialect_for(config.dialect)
        self.kv = KVCache(config.kv_blocks, config.block_size, preempt=config.preempt)
        self.recorder = Recorder(config.record_limit)
        self.fail_rules: list[FailRule] = []
        self.kv_usage_override: float | None = None
        self.reset_counters()

    def reset_counters(self) -> None:
        self.requests_total = 0
        self.completed = 0
        self.disconnects = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.kv.reset_counters()

    def reset(self) -> None:
        """Back to the start configuration, with nothing recorded (running requests
        keep their blocks: they release them when they end)."""
        self.config = self.base_config
        self.fail_rules.clear()
        self.kv_usage_override = None
        self.recorder.clear()
        self.reset_counters()

    def take_failure(self, path: str) -> FailRule | None:
        for rule in self.fail_rules:
            if rule.matches(path):
                rule.times -= 1
                if rule.times <= 0:
                    self.fail_rules.remove(rule)
                return rule
        return None

    def kv_usage(self) -> float:
        if self.kv_usage_override is not None:
            return self.kv_usage_override
        return self.kv.usage

    def configure(self, knobs: dict[str, Any]) -> None:
        """Apply ``POST /_sim/config``; all or nothing."""
        knobs = dict(knobs)
        rule = knobs.pop("fail_next", ...)
        override = knobs.pop("kv_usage_override", ...)
        config = self.config.updated(knobs)
        config.validate()
        new_rule = None if rule is ... or rule is None else FailRule.parse(rule)
        if override is not ... and override is not None:
            override = float(override)
            if not 0.0 <= override <= 1.0:
                raise ValueError("kv_usage_override must be within 0..1")
        self.config = config
        if rule is None:
            self.fail_rules.clear()
        elif new_rule is not None:
            self.fail_rules.append(new_rule)
        if override is not ...:
            self.kv_usage_override = override

    def describe(self) -> dict[str, Any]:
        return {
            "dialect": self.config.dialect,
            "running": self.kv.num_running,
            "waiting": self.kv.num_waiting,
            "requests_total": self.requests_total,
            "completed": self.completed,
            "disconnects": self.disconnects,
            "kv_used_blocks": self.kv.used_blocks,
            "kv_total_blocks": self.kv.total_blocks,
            "kv_usage": self.kv_usage(),
            "prompt_tokens_total": self.prompt_tokens_total,
            "generation_tokens_total": self.generation_tokens_total,
            "prefix_cache_queries_total": self.kv.prefix_queries,
            "prefix_cache_hits_total": self.kv.prefix_hits,
            "prefix_cache_blocks": self.kv.pool.num_cached,
            "preemptions_total": self.kv.preemptions,
            "config": self.config.as_dict(),
            "fail_next": [vars(rule).copy() for rule in self.fail_rules],
            "kv_usage_override": self.kv_usage_override,
        }


STATE = web.AppKey("sim_state", SimState)
RECORD = web.RequestKey("sim_record", Record)
