"""Every metric the proxy exports, declared in one place (docs/architecture.md §15).

Metrics live on a ``Metrics`` object built by the app factory, each on the
registry it is given, so several apps (tests, workers) never collide. With more
than one worker, prometheus-client's multiprocess mode writes the values to
``PROMETHEUS_MULTIPROC_DIR`` (``trimproxy serve`` prepares it) and ``render``
aggregates them: counters and histograms add up, gauges say how (``multiprocess_mode``).
In one process the series each request records (request counts and durations, the
prompt and estimate histograms, the trim counters, in-flight) are kept as plain
numbers (``proxy.series``), which expose exactly what prometheus-client's objects
would, at a fraction of the cost per recording.

``_created`` series are left out of ``render``'s output by filtering at scrape
time, not with ``disable_created_metrics()`` or ``PROMETHEUS_DISABLE_CREATED_SERIES``:
both flip a process-wide flag inside prometheus-client (the env var at its import),
which would change every other registry in the process too.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client import multiprocess as mp
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from proxy.choices import Endpoint
from proxy.series import (
    CounterChild,
    HistogramChild,
    PlainGauge,
    UpDownGauge,
    counter_family,
    histogram_family,
)

# Prompt lengths from a few dozen tokens up to long-context models.
TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
# Chat answers take from milliseconds to many minutes.
SECONDS_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    600,
    1200,
)
# Estimate errors are whole tokens. The edges at -0.5 and 0.5 give exact zero a bucket of its
# own, (-0.5, 0], so the dashboard's share of exact counts is one bucket, and its rounded
# quantiles read 0 (not the -0.5 that interpolating inside (-1, 0] gives) for an exact counter.
ERROR_BUCKETS = (-4096, -1024, -256, -64, -16, -4, -1, -0.5, 0, 0.5, 1, 4, 16, 64, 256, 1024, 4096)

#: The routes that are not a dialect's: each is its own ``route`` label, as is every
#: dialect's path (the dialect table, ``proxy.pipeline.table``, adds them).
OWN_ROUTES = frozenset(
    (
        "/v1/models",
        "/v1/embeddings",
        "/tokenize",
        "/detokenize",
        "/healthz",
        "/readyz",
        "/metrics",
    )
)

CONTENT_TYPE = CONTENT_TYPE_LATEST
#: The ``model`` label of a chat request whose model is in neither the models file nor
#: an upstream's list (the names come from clients: the label must stay bounded).
OTHER_MODEL = "other"
#: Engines that get an ``engine`` label of their own; those found after are ``other``.
MAX_ENGINE_LABELS = 64
OTHER_ENGINE = "other"
#: The built-in dialects' ``endpoint`` labels, in the order dashboards and ``top`` list
#: them; bound up front so each series reads 0 from the start.
ENDPOINTS: tuple[Endpoint, ...] = ("chat", "responses", "messages", "completions")


def route_label(path: str, known: frozenset[str] = OWN_ROUTES) -> str:
    """Bounded ``route`` label: the known paths by name (``known``: the proxy's own and
    every dialect's, from the dialect table), everything else ``other``."""
    return path if path in known else "other"


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def clear_multiprocess_dir(directory: str) -> None:
    """Create the directory, or remove the metric files an earlier run left in it.

    Only prometheus-client's ``*.db`` files go: the directory is the operator's and
    may hold other things. (Run one proxy per directory: a second would clear the
    first one's numbers.)
    """
    os.makedirs(directory, exist_ok=True)
    for path in glob.glob(os.path.join(directory, "*.db")):
        os.remove(path)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        # The series every request records are plain numbers in one process (see
        # _PlainCounter); prometheus-client's own objects where its multiprocess mode
        # needs their mmap'd values. Decided the way render decides what to read.
        plain = multiprocess_dir() is None
        self.requests = counter_family(
            plain,
            "trimproxy_requests",
            "Requests answered, by route and HTTP status code.",
            ("route", "code"),
            r,
        )
        self.request_duration = histogram_family(
            plain,
            "trimproxy_request_duration_seconds",
            "Time from request start to the last byte of the answer.",
            ("route",),
            SECONDS_BUCKETS,
            r,
        )
        self.upstream_ttfb = histogram_family(
            plain,
            "trimproxy_upstream_ttfb_seconds",
            "Time from forwarding to the upstream's first body byte.",
            ("route",),
            SECONDS_BUCKETS,
            r,
        )
        self.prompt_tokens = histogram_family(
            plain,
            "trimproxy_prompt_tokens",
            "Prompt tokens as received and as forwarded, by model and endpoint.",
            ("stage", "model", "endpoint"),
            TOKEN_BUCKETS,
            r,
        )
        self.trimmed_messages = counter_family(
            plain,
            "trimproxy_trimmed_messages",
            "Messages (or items) dropped by trimming.",
            ("model", "endpoint"),
            r,
        )
        self.trimmed_tokens = counter_family(
            plain,
            "trimproxy_trimmed_tokens",
            "Prompt tokens dropped by trimming.",
            ("model", "endpoint"),
            r,
        )
        self.cleared_outputs = counter_family(
            plain,
            "trimproxy_cleared_tool_outputs",
            "Tool outputs whose content the trim ladder cleared, by endpoint.",
            ("endpoint",),
            r,
        )
        self.cleared_output_tokens = counter_family(
            plain,
            "trimproxy_cleared_tool_output_tokens",
            "Prompt tokens the cleared tool outputs held beyond their placeholders.",
            ("endpoint",),
            r,
        )
        self.trim_events = counter_family(
            plain,
            "trimproxy_trim_events",
            "Requests whose history was trimmed, by reason, model and endpoint.",
            ("reason", "model", "endpoint"),
            r,
        )
        self.session_limits = Counter(
            "trimproxy_session_limit",
            "Session limits hit, by reason, action and endpoint.",
            ["reason", "action", "endpoint"],
            registry=r,
        )
        self.in_flight: UpDownGauge
        if plain:
            self.in_flight = PlainGauge(
                "trimproxy_requests_in_flight", "Requests being served now.", r
            )
        else:
            self.in_flight = Gauge(
                "trimproxy_requests_in_flight",
                "Requests being served now.",
                registry=r,
                multiprocess_mode="livesum",
            )
        self.upstream_errors = Counter(
            "trimproxy_upstream_errors",
            "Failures talking to the upstream, by kind.",
            ["kind"],
            registry=r,
        )
        self.upstream_retries = Counter(
            "trimproxy_upstream_retries",
            "Requests sent once more on a fresh connection, by reason (disconnected: the "
            "engine closed the connection before any of the answer came).",
            ["reason"],
            registry=r,
        )
        self.token_count_fallbacks = Counter(
            "trimproxy_token_count_fallbacks",
            "Prompts (or parts of them) the upstream /tokenize counter left to the local "
            "estimate, by reason (bound, error, timeout).",
            ["reason"],
            registry=r,
        )
        self.estimate_error = histogram_family(
            plain,
            "trimproxy_token_estimate_error_tokens",
            "Counted prompt tokens minus the upstream's usage.prompt_tokens, by model.",
            ("model",),
            ERROR_BUCKETS,
            r,
        )
        # The upstream's own numbers (proxy/scrape.py). One worker scrapes at a time;
        # "mostrecent" exports the freshest write, whichever worker made it.
        self.kv_cache_usage = Gauge(
            "trimproxy_upstream_kv_cache_usage_ratio",
            "The upstream's KV-cache usage (0..1), scraped from its /metrics.",
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.upstream_running = Gauge(
            "trimproxy_upstream_requests_running",
            "Requests the upstream is running now (vllm:num_requests_running).",
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.upstream_waiting = Gauge(
            "trimproxy_upstream_requests_waiting",
            "Requests queued in the upstream (vllm:num_requests_waiting).",
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.upstream_metrics_up = Gauge(
            "trimproxy_upstream_metrics_up",
            "1 when the last scrape of the upstream's /metrics found its KV-cache usage, "
            "else 0 (the trimproxy_upstream_* gauges then hold stale or no values).",
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.sessions_held = Gauge(
            "trimproxy_sessions",
            "Sessions held by this process's in-memory store.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.session_store_errors = Counter(
            "trimproxy_session_store_errors",
            "Chat requests whose session check failed because the store was unavailable.",
            registry=r,
        )
        self.response_store_entries = Gauge(
            "trimproxy_response_store_entries",
            "Responses held by this process's in-memory response store.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.response_store_bytes = Gauge(
            "trimproxy_response_store_bytes",
            "Bytes of the responses held by this process's in-memory response store.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.response_store_skipped = Counter(
            "trimproxy_response_store_skipped",
            "Answers served but not stored, by reason: entry_bytes, chain_bytes, unavailable.",
            ["reason"],
            registry=r,
        )
        self.response_store_lookups = Counter(
            "trimproxy_response_store_lookups",
            "Lookups of a stored response (previous_response_id, GET, DELETE), by "
            "outcome: hit, miss, unavailable.",
            ["outcome"],
            registry=r,
        )
        # Compaction (proxy/compaction): the items made, by how the client asked
        # (endpoint, trigger, threshold), and the items sent back, by what came of them.
        self.compactions = Counter(
            "trimproxy_compactions",
            "Compaction items made, by form: endpoint (POST /v1/responses/compact), "
            "trigger (a compaction_trigger input item), threshold (context_management).",
            ["form"],
            registry=r,
        )
        self.compaction_items = Counter(
            "trimproxy_compaction_items",
            "Compaction items received in a request's input, by outcome: expanded, "
            "refused (changed, another API key's or another deployment's: a 400).",
            ["outcome"],
            registry=r,
        )
        # KV admission (proxy/admission). Every process knows the whole capacity: "max".
        # Each process counts the reservations it holds, so "livesum" (and a sum over
        # replicas) is what the engine holds in all.
        self.kv_capacity = Gauge(
            "trimproxy_kv_capacity_tokens",
            "KV-cache tokens that admission may reserve (engine capacity x fraction).",
            registry=r,
            multiprocess_mode="max",
        )
        self.kv_reserved = Gauge(
            "trimproxy_kv_reserved_tokens",
            "KV-cache tokens reserved by the chat requests this process has in flight.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.admission_wait = Histogram(
            "trimproxy_admission_wait_seconds",
            "Time chat requests waited for KV room (0 for those admitted at once).",
            buckets=(0.0, *SECONDS_BUCKETS),
            registry=r,
        )
        self.admission_rejected = Counter(
            "trimproxy_admission_rejected",
            "Requests KV admission turned away, by reason (timeout, "
            "store_unavailable, client_closed) and endpoint.",
            ["reason", "endpoint"],
            registry=r,
        )
        # Several engines behind one upstream (proxy/engines): the bounded ``engine``
        # label names each (engine_label). The unlabelled trimproxy_upstream_* and
        # trimproxy_kv_* series above stay the aggregates dashboards already read.
        self.engine_up = Gauge(
            "trimproxy_engine_up",
            "1 while the engine is in the rotation (its last connection or health probe "
            "succeeded), else 0.",
            ["engine"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        # On every forwarded request: a plain number in one process (proxy.series).
        self.engine_requests = counter_family(
            plain, "trimproxy_engine_requests", "Requests forwarded to each engine.", ("engine",), r
        )
        self.engine_prefix_hit_ratio = Gauge(
            "trimproxy_engine_prefix_cache_hit_ratio",
            "The engine's prefix-cache hits over queries since it started "
            "(vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total).",
            ["engine"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.engine_preemptions = Gauge(
            "trimproxy_engine_preemptions",
            "Each engine's own count of preemptions since it started "
            "(vllm:num_preemptions_total, scraped).",
            ["engine"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.engine_kv_usage = Gauge(
            "trimproxy_engine_kv_cache_usage_ratio",
            "Each engine's KV-cache usage (0..1), scraped from its /metrics.",
            ["engine"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.engine_running = Gauge(
            "trimproxy_engine_requests_running",
            "Requests each engine is running now (vllm:num_requests_running).",
            ["engine"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.engine_waiting = Gauge(
            "trimproxy_engine_requests_waiting",
            "Requests queued in each engine (vllm:num_requests_waiting).",
            ["engine"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.engine_kv_capacity = Gauge(
            "trimproxy_engine_kv_capacity_tokens",
            "KV-cache tokens that admission may reserve on each engine.",
            ["engine"],
            registry=r,
            multiprocess_mode="max",
        )
        self.engine_kv_reserved = Gauge(
            "trimproxy_engine_kv_reserved_tokens",
            "KV-cache tokens reserved on each engine by this process's chat requests.",
            ["engine"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self._engine_labels: dict[str, str] = {}
        self.admission_overrun = Counter(
            "trimproxy_admission_overrun",
            "Answers that ran past their KV reservation: their request named no max_tokens "
            "and TRIMPROXY_MAX_COMPLETION_TOKENS is unset, so only the default reserve was "
            "reserved.",
            registry=r,
        )
        self.admission_overrun_tokens = Counter(
            "trimproxy_admission_overrun_tokens",
            "Completion tokens those answers generated beyond their reservations.",
            registry=r,
        )
        self.answers_continued = Counter(
            "trimproxy_answers_continued",
            "Streamed answers whose engine broke off mid-answer and that another engine "
            "continued (docs/architecture.md §23), by what broke: reset, timeout, error_event.",
            ["reason"],
            registry=r,
        )

        self.context_edits = Counter(
            "trimproxy_context_edits",
            "Anthropic context edits a /v1/messages request asked for that cleared something "
            "(docs/dialects.md), by type: clear_tool_uses_20250919, clear_thinking_20251015.",
            ["type"],
            registry=r,
        )
        self.context_edit_cleared = Counter(
            "trimproxy_context_edit_cleared",
            "What those edits cleared, by type: tool uses (clear_tool_uses_20250919), "
            "thinking turns (clear_thinking_20251015).",
            ["type"],
            registry=r,
        )
        self.context_edit_cleared_tokens = Counter(
            "trimproxy_context_edit_cleared_tokens",
            "Prompt tokens those edits cleared (applied_edits' cleared_input_tokens), by type.",
            ["type"],
            registry=r,
        )

        self.build_info = Gauge(
            "trimproxy_build_info",
            "Always 1; the version label says which trimproxy this is.",
            ["version"],
            registry=r,
            multiprocess_mode="max",
        )
        self.build_info.labels(_version()).set(1)

        # Children of the per-request series, resolved once: labels() takes a lock and
        # builds a key on every call, and the hot path needs only a handful. One map of
        # model labels per endpoint: a request looks up its model, never builds a key.
        self._models: dict[str, dict[str, ModelSeries]] = {}
        self.chat_ttfb = self.upstream_ttfb.labels("/v1/chat/completions")
        self._answered: dict[tuple[str, int], tuple[CounterChild, HistogramChild]] = {}

    def for_model(self, label: str, endpoint: Endpoint, route: str) -> ModelSeries:
        """The series of one ``model`` label (bounded by the caller: a name from the
        models file or an upstream's list, else ``other``) on one endpoint, served on
        ``route`` (the label of its upstream time to first byte)."""
        models = self._models.get(endpoint)
        if models is None:
            models = self._models[endpoint] = {}
        series = models.get(label)
        if series is None:
            series = models[label] = ModelSeries(self, label, endpoint, route)
        return series

    def engine_label(self, name: str) -> str:
        """``name``'s ``engine`` label: its own for the first ``MAX_ENGINE_LABELS``
        engines this process meets (configured or discovered), ``other`` after."""
        label = self._engine_labels.get(name)
        if label is not None:
            return label
        if len(self._engine_labels) >= MAX_ENGINE_LABELS:
            return OTHER_ENGINE  # not kept: engines that come and go must not grow this
        self._engine_labels[name] = name
        return name

    def answered(self, route: str, status: int, seconds: float) -> None:
        """Count one answered request and its duration."""
        children = self._answered.get((route, status))
        if children is None:
            children = (
                self.requests.labels(route, str(status)),
                self.request_duration.labels(route),
            )
            self._answered[(route, status)] = children
        children[0].inc()
        children[1].observe(seconds)

    def render(self) -> bytes:
        directory = multiprocess_dir()
        registry = CollectorRegistry(auto_describe=False)
        if directory:
            _forget_dead_processes(directory)
            mp.MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
        else:
            registry.register(_WithoutCreated(self.registry))
        return generate_latest(registry)

    def close(self) -> None:
        """At worker shutdown: drop this process's share of the ``live*`` gauges."""
        directory = multiprocess_dir()
        if directory:
            mp.mark_process_dead(os.getpid(), directory)  # type: ignore[no-untyped-call]


class ModelSeries:
    """The per-request series of one model on one endpoint, resolved once."""

    __slots__ = (
        "_cleared_outputs",
        "_cleared_tokens",
        "_trim_events",
        "_trim_reasons",
        "endpoint",
        "estimate_error",
        "label",
        "prompt_forwarded",
        "prompt_received",
        "trimmed_messages",
        "trimmed_tokens",
        "ttfb",
    )

    def __init__(self, metrics: Metrics, label: str, endpoint: Endpoint, route: str) -> None:
        self.label = label
        self.endpoint: Endpoint = endpoint
        self.prompt_received = metrics.prompt_tokens.labels("received", label, endpoint)
        self.prompt_forwarded = metrics.prompt_tokens.labels("forwarded", label, endpoint)
        self.trimmed_messages = metrics.trimmed_messages.labels(label, endpoint)
        self.trimmed_tokens = metrics.trimmed_tokens.labels(label, endpoint)
        self.estimate_error = metrics.estimate_error.labels(label)
        self.ttfb = metrics.upstream_ttfb.labels(route)
        self._trim_events = metrics.trim_events
        self._trim_reasons: dict[str, CounterChild] = {}
        self._cleared_outputs = metrics.cleared_outputs.labels(endpoint)
        self._cleared_tokens = metrics.cleared_output_tokens.labels(endpoint)

    def cleared(self, outputs: int, tokens: int) -> None:
        """One request whose tool outputs the trim ladder cleared: how many, and the
        tokens they held beyond their placeholders."""
        self._cleared_outputs.inc(outputs)
        self._cleared_tokens.inc(tokens)

    def trimmed(self, messages: int, tokens: int, reason: str) -> None:
        """One trimmed request: the messages and prompt tokens it dropped, and why."""
        self.trimmed_messages.inc(messages)
        self.trimmed_tokens.inc(tokens)
        # One child per reason (budget, max_turns, session), resolved on first use.
        child = self._trim_reasons.get(reason)
        if child is None:
            child = self._trim_reasons[reason] = self._trim_events.labels(
                reason, self.label, self.endpoint
            )
        child.inc()


def _version() -> str:
    import proxy

    return proxy.__version__


class _WithoutCreated(Collector):
    """A registry's families minus their ``<name>_created`` samples."""

    def __init__(self, source: CollectorRegistry) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        for family in self._source.collect():
            created = family.name + "_created"
            family.samples = [s for s in family.samples if s.name != created]
            yield family


def _forget_dead_processes(directory: str) -> None:
    """Remove the ``live*`` gauge files of workers that are gone.

    A worker that exits cleanly does this itself (``Metrics.close``); one that was
    killed cannot, and its in-flight count would otherwise stay in the sum forever.
    Counter and histogram files stay: what a dead worker counted still happened.
    """
    for path in glob.glob(os.path.join(directory, "gauge_live*_*.db")):
        pid_text = os.path.basename(path).rsplit("_", 1)[-1].removesuffix(".db")
        if pid_text.isdigit() and not _alive(int(pid_text)):
            mp.mark_process_dead(int(pid_text), directory)  # type: ignore[no-untyped-call]


def _alive(pid: int) -> bool:
    # A killed worker stays a zombie until uvicorn's supervisor reaps it (up to about
    # a second), and a signal 0 still reaches a zombie: on Linux, ask /proc instead.
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read()
    except FileNotFoundError:
        return not os.path.isdir("/proc/self") and _signalable(pid)
    except OSError:
        return _signalable(pid)
    state = fields[fields.rfind(b")") + 2 :][:1]  # the field after "(command name)"
    return state not in (b"Z", b"X")


def _signalable(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True
