"""The vLLM engine's ``/metrics`` vocabulary, read in one place.

Four parts of trimproxy read the engine's own page: the scraper (KV usage, running and
waiting requests), KV admission (the cache's size), ``trimproxy plan --from-engine``
(the cache's geometry) and ``trimproxy soak`` (all of it, twice a second). They share
the names and the two readers here.

vLLM's page runs to hundreds of kilobytes of histograms, so only the lines of the
wanted families are handed to prometheus-client's (pure-Python) text parser
(``selected``). The cache's geometry is an info-style gauge whose figures are its
labels, one series per engine (data-parallel ranks each have their own cache)::

    vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="2043",...} 1.0

``cache_config_labels`` reads those labels with a line scan.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: KV-cache usage, a 0..1 fraction despite the name; V0 called it ``gpu_cache_usage_perc``.
KV_USAGE_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PREEMPTIONS = "vllm:num_preemptions_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
CACHE_CONFIG_INFO = "vllm:cache_config_info"

_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def line_prefixes(names: Iterable[str]) -> tuple[str, ...]:
    """The line starts of the families ``names``: samples and their TYPE/HELP lines."""
    return tuple(p for n in names for p in (f"{n}{{", f"{n} ", f"# TYPE {n} ", f"# HELP {n} "))


def selected(text: str, prefixes: tuple[str, ...]) -> str:
    """Only the lines that start with ``prefixes`` (see ``line_prefixes``), for the parser."""
    return "\n".join(line for line in text.splitlines() if line.startswith(prefixes)) + "\n"


def cache_config_labels(text: str) -> list[dict[str, str]]:
    """The labels of every ``vllm:cache_config_info`` series, one dict per engine."""
    prefix = CACHE_CONFIG_INFO + "{"
    found: list[dict[str, str]] = []
    for line in text.splitlines():
        if line.startswith(prefix):
            found.append(dict(_LABEL.findall(line[len(prefix) : line.rfind("}")])))
    return found
