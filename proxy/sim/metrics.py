"""``GET /metrics`` in Prometheus text format, with vLLM's metric names.

Written by hand rather than with prometheus-client: no global registry, and a
scrape costs a few string joins.

vLLM V1 labels every series with ``model_name`` and ``engine``; V0
(``legacy_metrics``) used ``model_name`` alone and named the KV gauge
``vllm:gpu_cache_usage_perc``. Both gauges are fractions (1 = 100 %) despite the name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from proxy.sim.state import SimState


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_metrics(state: SimState) -> str:
    cfg = state.config
    labels = f'model_name="{_escape(cfg.model)}"'
    if not cfg.legacy_metrics:
        labels = f'engine="0",{labels}'
    kv_name, kv_help = (
        ("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.")
        if cfg.legacy_metrics
        else ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
    )
    series = (
        (
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            state.kv.num_running,
        ),
        (
            "vllm:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            state.kv.num_waiting,
        ),
        (kv_name, "gauge", kv_help, state.kv_usage()),
        (
            "vllm:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            state.prompt_tokens_total,
        ),
        (
            "vllm:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            state.generation_tokens_total,
        ),
        (
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
            state.kv.prefix_queries,
        ),
        (
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
            state.kv.prefix_hits,
        ),
    )
    lines: list[str] = []
    for name, kind, help_text, value in series:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.append(f"{name}{{{labels}}} {float(value)!r}")
    if not cfg.legacy_metrics:
        # V1 publishes the cache geometry as an info-style gauge; KV admission's `auto`,
        # `trimproxy plan --from-engine` and `trimproxy soak` read it. Preemptions
        # happen only with `preempt` (kv.py); otherwise the counter stays zero.
        info = (
            f'block_size="{state.kv.block_size}",engine="0",'
            f'num_gpu_blocks="{state.kv.total_blocks}"'
        )
        lines += [
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge",
            f"vllm:cache_config_info{{{info}}} 1.0",
            "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
            "# TYPE vllm:num_preemptions_total counter",
            f"vllm:num_preemptions_total{{{labels}}} {float(state.kv.preemptions)!r}",
        ]
    return "\n".join(lines) + "\n"
