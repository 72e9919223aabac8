"""The vLLM engine's ``/metrics`` vocabulary, read in one place.

Four parts of trimproxy read the engine's own page: the scraper (KV usage, running and
waiting requests), KV admission (the cache's size), ``trimproxy plan --from-engine``
(the cache's geometry) and ``trimproxy soak`` (all of it, twice a second). They share
the names and the readers here: ``engine_figures`` for the gauges and counters,
``cache_config_labels`` for the geometry.

vLLM's page runs to hundreds of kilobytes of histograms, so only the lines of the
wanted families are handed to prometheus-client's (pure-Python) text parser
(``selected``). The cache's geometry is an info-style gauge whose figures are its
labels, one series per engine (data-parallel ranks each have their own cache)::

    vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="2043",...} 1.0

``cache_config_labels`` reads those labels with a line scan.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

#: KV-cache usage, a 0..1 fraction despite the name; V0 called it ``gpu_cache_usage_perc``.
KV_USAGE_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PREEMPTIONS = "vllm:num_preemptions_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
CACHE_CONFIG_INFO = "vllm:cache_config_info"

#: Summed over the page's label sets (engines, models) by ``engine_figures``.
SUMMED = (RUNNING, WAITING, PREEMPTIONS, PREFIX_HITS, PREFIX_QUERIES)

_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def line_prefixes(names: Iterable[str]) -> tuple[str, ...]:
    """The line starts of the families ``names``: samples and their TYPE/HELP lines."""
    return tuple(p for n in names for p in (f"{n}{{", f"{n} ", f"# TYPE {n} ", f"# HELP {n} "))


def selected(text: str, prefixes: tuple[str, ...]) -> str:
    """Only the lines that start with ``prefixes`` (see ``line_prefixes``), for the parser."""
    return "\n".join(line for line in text.splitlines() if line.startswith(prefixes)) + "\n"


_FIGURES = (*KV_USAGE_NAMES, *SUMMED)
# Only these families reach the parser: a page costs a string scan rather than
# milliseconds of parsing.
_FIGURE_LINES = line_prefixes(_FIGURES)


def engine_figures(text: str) -> tuple[float | None, dict[str, float]]:
    """The KV-cache usage, the maximum over the page's label sets (the fullest engine
    is the one that preempts first), and each of ``SUMMED`` that the page has, summed;
    NaN samples are left out. ``ValueError`` (prometheus-client's) on a malformed line."""
    found: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(selected(text, _FIGURE_LINES)):
        for sample in family.samples:
            if sample.name in _FIGURES and not math.isnan(sample.value):
                found.setdefault(sample.name, []).append(sample.value)
    kv = next((max(found[n]) for n in KV_USAGE_NAMES if n in found), None)
    return kv, {name: sum(found[name]) for name in SUMMED if name in found}


def cache_config_labels(text: str) -> list[dict[str, str]]:
    """The labels of every ``vllm:cache_config_info`` series, one dict per engine."""
    prefix = CACHE_CONFIG_INFO + "{"
    found: list[dict[str, str]] = []
    for line in text.splitlines():
        if line.startswith(prefix):
            found.append(dict(_LABEL.findall(line[len(prefix) : line.rfind("}")])))
    return found
