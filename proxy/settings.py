"""Every knob of the proxy, read from ``TRIMPROXY_*`` environment variables.

One pydantic-settings class; ``trimproxy serve --help`` prints each field's
description, and a bad value stops start-up with one line naming the variable.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from proxy.choices import DEFAULT_SESSION_HEADER, LimitAction, StoreFailure
from proxy.engines.discovery import parse_dns_url, split_nameserver
from proxy.engines.urls import DNS_PREFIX, joined, parse_upstream

ENV_PREFIX = "TRIMPROXY_"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        frozen=True,
    )

    upstream_url: str = Field(
        "http://127.0.0.1:8000",
        description="Root URL of the FastChat or vLLM OpenAI server (a trailing /v1 is "
        "dropped), or several engines serving the same models, comma-separated "
        "(docs/engines.md).",
    )
    host: str = Field("127.0.0.1", description="Address the proxy listens on.")
    port: int = Field(8080, ge=1, le=65535, description="Port the proxy listens on.")
    workers: int = Field(1, ge=1, le=64, description="Worker processes (metrics aggregate).")

    max_prompt_tokens: int | None = Field(
        None, ge=1, description="Hard cap on forwarded prompt tokens."
    )
    context_window: int | None = Field(
        None,
        ge=1,
        description="The model's context length; discovered from the upstream's "
        "/v1/models (max_model_len) when unset.",
    )
    default_completion_reserve: int = Field(
        512,
        ge=0,
        description="Tokens kept free for the answer when a request names no max_tokens "
        "(and TRIMPROXY_MAX_COMPLETION_TOKENS is unset).",
    )
    max_completion_tokens: int | None = Field(
        None,
        ge=1,
        description="Cap on the completion tokens a request may ask: a larger max_tokens "
        "is lowered to it (X-Trimproxy-Max-Tokens-Capped says so), and it is filled in "
        "when a request names none. Makes KV admission's bound hard; unset, vLLM lets an "
        "answer without max_tokens run to the context window.",
    )
    tokenizer: str = Field(
        "auto",
        description="Token counter: hf:<dir or id>, tiktoken:<encoding>, upstream, approx, auto.",
    )
    trim_target: float = Field(
        0.6,
        gt=0.0,
        le=1.0,
        description="Low-water mark, a fraction of the budget, that a cut trims down to; "
        "the cut then holds while the conversation grows back (prefix-cache friendly).",
    )
    max_history_turns: int | None = Field(
        None, ge=1, description="Keep at most this many of the latest turns."
    )
    pin_first_user: bool = Field(
        False, description="Always keep the first user turn (constraints stated early)."
    )
    clear_tool_outputs: Literal["auto", "off"] = Field(
        "auto",
        description="The trim ladder's first rung: clear the content of the oldest tool "
        "outputs before dropping whole turns; off keeps the whole-turn trim alone.",
    )
    keep_tool_outputs: int = Field(
        3, ge=0, description="The latest tool outputs the trim ladder never clears."
    )

    session_max_turns: int | None = Field(
        None, ge=1, description="User turns a session may run before the limit action."
    )
    session_max_age: float | None = Field(
        None, gt=0, description="Seconds a session may live before the limit action."
    )
    session_idle_ttl: float = Field(
        3600.0, gt=0, description="Seconds session state is kept after its last use."
    )
    session_limit_action: LimitAction = Field(
        "reset", description="On a session limit: reset the history, or reject with 409."
    )
    session_header: str = Field(
        DEFAULT_SESSION_HEADER,
        min_length=1,
        description="Request header that names the session.",
    )
    session_max_entries: int = Field(
        100_000,
        ge=1,
        description="Sessions the in-memory store holds before evicting LRU; also the most "
        "sessions whose engine session routing remembers (docs/architecture.md §20).",
    )
    redis_url: str | None = Field(
        None, description="Redis URL for a session store shared by replicas; in-memory when unset."
    )
    session_store_failure: StoreFailure = Field(
        "open",
        description="When Redis fails: open serves without session limits, closed answers 503.",
    )
    response_store_entries: int = Field(
        10_000,
        ge=1,
        description="Responses the response store holds (previous_response_id) before "
        "evicting the least recently used: in this process, or in Redis for all replicas "
        "together when TRIMPROXY_REDIS_URL is set.",
    )
    response_store: bool = Field(
        True,
        description="Keep Responses API responses for previous_response_id and GET "
        "/v1/responses/{id}; false keeps nothing (every previous_response_id answers 400).",
    )
    response_store_entry_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="The most bytes one stored response (one turn: its own input and its "
        "output, as JSON) may hold; a bigger one is served but not stored.",
    )
    response_store_chain_bytes: int = Field(
        32 * 1024 * 1024,
        ge=1024,
        description="The most bytes a chain of stored responses may hold together; a turn "
        "past it is served but not stored (the client sends the whole conversation).",
    )
    response_store_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description="The most bytes the response store holds in all (in this process, or "
        "in Redis for all replicas together) before evicting the least recently used.",
    )
    response_store_ttl: float = Field(
        3600.0, gt=0, description="Seconds a stored response is kept after its last use."
    )
    compaction_key: str | None = Field(
        None,
        description="Key that seals Responses compaction items (64 hex digits, or any "
        "text, hashed): items then open after a restart and on every replica. Unset: "
        "the key kept in Redis when TRIMPROXY_REDIS_URL is set, else one drawn at start "
        "(items die with the process).",
    )
    compaction_max_bytes: int = Field(
        1_000_000,
        ge=1024,
        description="Largest compaction item (its encrypted_content) made or taken; the "
        "oldest folded items are left out of one that would be larger.",
    )
    compaction_summary: bool = Field(
        False,
        description="Compaction also asks the engine for a summary of what it folds (a "
        "budgeted, admitted request); off: compaction costs no model call.",
    )

    api_keys: str | None = Field(
        None,
        description="Comma-separated keys the proxy accepts on /v1/*, as Authorization: "
        "Bearer <key> or X-Api-Key: <key>; open when unset.",
    )
    blind_routes: Literal["relay", "refuse"] = Field(
        "relay",
        description="Routes under /v1/ that carry no bounded prompt (embeddings, audio, "
        "anything but chat, completions, responses, messages and GET /v1/models) and "
        "/tokenize, /detokenize: relay passes them to the upstream as they are, refuse "
        "answers 404.",
    )
    upstream_api_key: str | None = Field(
        None, description="Key sent upstream in place of the client's."
    )
    max_body_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, description="Largest request body accepted (413 above)."
    )
    max_in_flight: int | None = Field(
        None, ge=1, description="Concurrent requests per worker before answering 429."
    )
    connect_timeout: float = Field(5.0, gt=0, description="Upstream connect timeout, seconds.")
    read_timeout: float = Field(
        600.0, gt=0, description="Upstream read timeout between bytes, seconds."
    )
    upstream_metrics_interval: float = Field(
        5.0, ge=0, description="Seconds between scrapes of the upstream's /metrics; 0 = off."
    )
    body_timeout: float = Field(
        60.0,
        gt=0,
        description="Seconds a client has to send the whole request body; 408 after. "
        "A request counts as in flight only once its body is in.",
    )
    header_timeout: float = Field(
        10.0,
        gt=0,
        description="Seconds a connection has to send a request's headers (a new one, or the "
        "next request on a kept-alive one); closed after.",
    )
    idle_timeout: int = Field(
        5, ge=1, description="Seconds an idle keep-alive client connection is kept open."
    )
    max_header_bytes: int = Field(
        65536,
        ge=4096,
        description="Largest request line plus headers accepted (431 and a close above).",
    )
    max_model_name_length: int = Field(
        256, ge=1, description="Longest model name accepted in a request (400 above)."
    )
    models_refresh: float = Field(
        60.0,
        gt=0,
        description="Seconds the upstream's list of served models (and their context "
        "windows) is kept before it is fetched again; a failed fetch is retried with backoff.",
    )
    models_retry: float = Field(
        10.0,
        gt=0,
        description="Seconds before a failed fetch of the upstream's served models is tried "
        "again; doubled on each further failure, up to TRIMPROXY_MODELS_REFRESH.",
    )
    kv_admission: str = Field(
        "off",
        description="KV admission: off, auto (the capacity from vLLM's /metrics), or the "
        "engine's KV capacity in tokens; requests reserve prompt + n x completion allowance.",
    )
    kv_admission_fraction: float = Field(
        1.0,
        gt=0,
        le=16,
        description="Share of the KV capacity that may be reserved: below 1 for headroom, "
        "above 1 to overcommit an engine that manages its own cache (vLLM).",
    )
    admission_timeout: float = Field(
        30.0, ge=0, description="Seconds a request waits for KV room before 429 overloaded."
    )
    kv_admission_replicas: int = Field(
        1,
        ge=1,
        description="Proxy replicas sharing one engine: without Redis (or while it is down) "
        "each process admits up to capacity / (replicas x workers).",
    )
    ready_requires_upstream: bool = Field(
        True,
        description="GET /readyz answers 503 while the upstream is down. Turn it off behind "
        "a Service shared by replicas of one upstream (deploy/kubernetes does): an outage "
        "would take every replica out at once, and clients would get connection refused "
        "instead of a 502 naming the upstream.",
    )
    ready_timeout: float = Field(
        2.0,
        gt=0,
        description="Seconds GET /readyz waits for the upstream; keep the readiness probe's "
        "timeout above it.",
    )
    graceful_shutdown_timeout: int | None = Field(
        None,
        ge=1,
        description="Seconds to let open requests (long streams) finish after SIGTERM before "
        "they are cancelled; none waits for all. Keep it below the pod's grace period.",
    )
    routing: Literal["session", "least_loaded", "round_robin"] = Field(
        "session",
        description="How a chat request picks one of several engines: session (each session "
        "keeps its engine, for the prefix cache), least_loaded, or round_robin.",
    )
    routing_load_factor: float = Field(
        0.25,
        ge=0,
        description="session routing: an engine that would hold more than (1 + this) x the "
        "mean number of sessions is passed over for the session's next engine (bounded load).",
    )
    routing_session_idle: float = Field(
        300.0,
        gt=0,
        description="session routing: seconds a session still counts as held by its engine "
        "after its last request (about how long an engine's prefix cache keeps an idle "
        "conversation).",
    )
    health_interval: float = Field(
        5.0,
        gt=0,
        description="Seconds between health probes (GET /v1/models) of each engine; an engine "
        "out of the rotation is probed with backoff up to this interval.",
    )
    continue_attempts: int = Field(
        1,
        ge=0,
        le=8,
        description="Times a streamed chat answer whose engine broke off mid-answer is "
        "continued on the session's next live engine (the answer so far sent as a final "
        "assistant message to continue); 0 turns it off: the stream ends in an error event.",
    )
    upstream_refresh: float = Field(
        10.0,
        gt=0,
        description="Seconds between DNS lookups of a dns+http://NAME:PORT upstream, whose "
        "every A/AAAA record is an engine: engines join and leave within one refresh.",
    )
    dns_nameserver: str | None = Field(
        None,
        description="HOST or HOST:PORT of the DNS server that resolves dns+http:// upstreams; "
        "none uses the system's resolver configuration (/etc/resolv.conf).",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level of the proxy's own logs."
    )
    models_file: str | None = Field(
        None,
        description='TOML file with one [models."NAME"] table per served model name: its '
        "upstream_url, tokenizer, context_window, max_prompt_tokens, ... (docs/models.md); "
        "models it does not name use the top-level settings.",
    )

    @field_validator("upstream_url", mode="before")
    @classmethod
    def _normalise_upstream(cls, value: object) -> str:
        if not isinstance(value, (str, list, tuple)):
            raise ValueError("expected a URL, a comma-separated list of URLs, or a list of them")
        entries = parse_upstream(value)
        if any(e.dns for e in entries) and len(entries) > 1:
            raise ValueError(
                "a dns+ URL names every engine of the upstream by itself: give it alone, "
                "or list the engines' URLs comma-separated without it"
            )
        if entries[0].dns:
            parse_dns_url(DNS_PREFIX + entries[0].url)  # DiscoveryError is a ValueError
        return joined(entries)

    @field_validator("dns_nameserver")
    @classmethod
    def _check_nameserver(cls, value: str | None) -> str | None:
        if value is not None and value.strip():
            split_nameserver(value)
            return value.strip()
        return None

    @field_validator("kv_admission", mode="before")
    @classmethod
    def _check_kv_admission(cls, raw: object) -> str:
        # A number in the models file (kv_admission = 4096) is as good as the string.
        if isinstance(raw, int) and not isinstance(raw, bool):
            raw = str(raw)
        if not isinstance(raw, str):
            raise ValueError("expected off, auto, or a positive number of tokens")
        value = raw.strip().lower()
        if value in ("off", "auto") or (value.isdigit() and int(value) > 0):
            return value
        raise ValueError("expected off, auto, or a positive number of tokens")

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value

    @field_validator("tokenizer")
    @classmethod
    def _check_tokenizer(cls, value: str) -> str:
        kind, _, arg = value.partition(":")
        if kind in ("auto", "approx", "upstream") and not arg:
            return value
        if kind in ("hf", "tiktoken") and arg:
            return value
        raise ValueError("expected hf:<dir or id>, tiktoken:<encoding>, upstream, approx or auto")

    @model_validator(mode="after")
    def _check_keys(self) -> Settings:
        if self.api_keys is not None and not self.api_key_set:
            raise ValueError("TRIMPROXY_API_KEYS is set but holds no key")
        return self

    @model_validator(mode="after")
    def _check_room(self) -> Settings:
        """A window that the completion reserve fills leaves every request no room for
        its prompt (docs/architecture.md §5: ``window - reserve - 1``): refused here,
        not answered 400 on every request."""
        window = self.context_window
        if window is None:
            return self
        if self.max_completion_tokens is not None:
            name, reserve = "MAX_COMPLETION_TOKENS", self.max_completion_tokens
        else:
            name, reserve = "DEFAULT_COMPLETION_RESERVE", self.default_completion_reserve
        if window - reserve - 1 < 1:
            raise ValueError(
                f"{ENV_PREFIX}CONTEXT_WINDOW={window} leaves no room for a prompt after "
                f"{ENV_PREFIX}{name}={reserve} (and 1 token of slack): set "
                f"{ENV_PREFIX}{name} to at most {max(0, window - 2)}, or "
                f"{ENV_PREFIX}CONTEXT_WINDOW to at least {reserve + 2}"
            )
        return self

    @property
    def api_key_set(self) -> frozenset[str]:
        if not self.api_keys:
            return frozenset()
        return frozenset(k.strip() for k in self.api_keys.split(",") if k.strip())


def describe_error(exc: ValidationError, sources: Mapping[str, str] | None = None) -> str:
    """One line per bad variable, named as the operator wrote it. ``sources``: where a
    variable that is not in the environment was read from (``./.env``, an env file),
    by its name; the line says so, or a stray file's value looks like the environment's."""
    sources = sources or {}
    lines = []
    for err in exc.errors():
        field = str(err["loc"][0]) if err["loc"] else ""
        if field:
            name = f"{ENV_PREFIX}{field.upper()}"
            where = f" (from {sources[name]})" if name in sources else ""
            lines.append(f"invalid {name}{where}: {err['msg']}")
        else:
            message = whole_error(err)
            named = [f"{n} from {w}" for n, w in sorted(sources.items()) if n in message]
            where = f" ({', '.join(named)})" if named else ""
            lines.append(f"invalid settings{where}: {message}")
    return "\n".join(lines)


def whole_error(err: Mapping[str, Any]) -> str:
    """The message of a check on several settings at once (a model validator), without
    pydantic's "Value error, " in front: it names the settings itself."""
    cause = err.get("ctx", {}).get("error")
    return str(cause) if isinstance(cause, ValueError) else str(err["msg"])


def unknown_variables(names: Iterable[str]) -> list[str]:
    """One warning per ``TRIMPROXY_*`` name that is no setting, naming the closest
    real one: a typo (``TRIMPROXY_TRIMTARGET``) would otherwise be ignored silently."""
    known = {f"{ENV_PREFIX}{field.upper()}" for field in Settings.model_fields}
    warnings = []
    for name in sorted(set(names)):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in known:
            continue
        # Compared without the prefix, which every name shares.
        fields = sorted(k[len(ENV_PREFIX) :] for k in known)
        close = difflib.get_close_matches(upper[len(ENV_PREFIX) :], fields, n=1, cutoff=0.6)
        hint = f"; did you mean {ENV_PREFIX}{close[0]}?" if close else ""
        warnings.append(f"{name} is not a trimproxy setting and is ignored{hint}")
    return warnings
