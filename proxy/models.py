"""Several models behind one proxy: the per-model table of ``TRIMPROXY_MODELS_FILE``.

The file is TOML with one table per served model name::

    [models."qwen2.5-7b"]
    upstream_url = "http://10.0.0.5:8000"
    tokenizer = "hf:/models/Qwen2.5-7B-Instruct"
    context_window = 32768
    max_prompt_tokens = 8000

Every key is optional and falls back to the top-level ``TRIMPROXY_*`` setting of the
same name; the values are checked by the very validators of ``Settings`` (each table
becomes a ``Settings`` of its own: the top-level values with the table's on top). A
model the file does not name uses the top-level settings. ``load_models`` reads and
checks the file (``ModelsFileError``: one line naming the file, table and key);
``build_routes`` builds one ``Upstream`` per distinct upstream and one counter per
(tokenizer, upstream), shared wherever they are equal.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from proxy.engines.engine import Engine
from proxy.engines.pool import EngineFactory
from proxy.settings import ENV_PREFIX, Settings, whole_error
from proxy.tokens import build_counter
from proxy.tokens.counter import FallbackHook, TokenCounter
from proxy.upstream import ContextWindows, ErrorHook, Upstream

log = logging.getLogger("trimproxy.models")

#: The keys a model's table may set: what decides where a request goes, how it is
#: counted, and how much of it is kept. Everything else is the proxy's, not a model's.
MODEL_KEYS = frozenset(
    {
        "upstream_url",
        "upstream_api_key",
        "tokenizer",
        "context_window",
        "max_prompt_tokens",
        "default_completion_reserve",
        "max_completion_tokens",
        "trim_target",
        "max_history_turns",
        "pin_first_user",
        "kv_admission",
    }
)


class ModelsFileError(ValueError):
    """A models file that cannot be used; the message is one line for the operator."""


@dataclass(frozen=True, slots=True)
class ModelSettings:
    """One ``[models."NAME"]`` table, merged over the top-level settings."""

    name: str
    settings: Settings


def load_models(settings: Settings) -> tuple[ModelSettings, ...]:
    """The models of ``settings.models_file``; () when none is set."""
    if settings.models_file is None:
        return ()
    path = Path(settings.models_file).expanduser()
    where = f"{ENV_PREFIX}MODELS_FILE={settings.models_file}"
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise ModelsFileError(f"{where}: cannot read it ({why})") from None
    except UnicodeDecodeError:
        raise ModelsFileError(f"{where}: not UTF-8 text") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ModelsFileError(f"{where}: not valid TOML: {exc}") from None
    extra = sorted(set(data) - {"models"})
    if extra:
        raise ModelsFileError(
            f'{where}: unknown top-level key {extra[0]!r}; the file holds [models."NAME"] tables'
        )
    tables = data.get("models", {})
    if not isinstance(tables, dict) or not tables:
        raise ModelsFileError(f'{where}: no [models."NAME"] table')
    base = settings.model_dump()
    out: list[ModelSettings] = []
    for name, table in tables.items():
        label = f'[models."{name}"]'
        if not isinstance(table, dict):
            raise ModelsFileError(f"{where}: {label} must be a table of settings")
        if not name.strip():
            raise ModelsFileError(f"{where}: {label}: the model name must not be empty")
        for key in table:
            if key not in MODEL_KEYS:
                raise ModelsFileError(
                    f"{where}: {label}: unknown key {key!r} (a model may set "
                    f"{', '.join(sorted(MODEL_KEYS))})"
                )
        try:
            merged = Settings.model_validate({**base, **table})
        except ValidationError as exc:
            err = exc.errors()[0]
            if not err["loc"]:  # a check on several keys at once names them itself
                raise ModelsFileError(f"{where}: {label}: {whole_error(err)}") from None
            key = str(err["loc"][0])
            raise ModelsFileError(f"{where}: {label}: {key}: {err['msg']}") from None
        out.append(ModelSettings(name, merged))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class ModelRoute:
    """Where one model's requests go, and what counts and bounds them."""

    name: str | None
    """The model name from the file; None for the top-level route."""
    settings: Settings
    upstream: Upstream
    windows: ContextWindows
    counter: TokenCounter


@dataclass(frozen=True, slots=True)
class ModelRoutes:
    """The top-level route, the file's routes by name, and what they share."""

    default: ModelRoute
    by_name: Mapping[str, ModelRoute]
    upstreams: tuple[Upstream, ...]
    """Distinct upstreams, the top-level one first."""
    counters: tuple[TokenCounter, ...]

    def route(self, model: str | None) -> ModelRoute:
        if model is None:
            return self.default
        return self.by_name.get(model, self.default)

    async def aclose(self) -> None:
        for counter in self.counters:
            await counter.aclose()
        for upstream in self.upstreams:
            await upstream.aclose()


def _upstream_key(settings: Settings) -> tuple[str, str | None]:
    return (settings.upstream_url, settings.upstream_api_key)


async def build_routes(
    settings: Settings,
    models: Sequence[ModelSettings],
    on_error: ErrorHook | None = None,
    engines: Callable[[Settings], EngineFactory] | None = None,
    on_retry: ErrorHook | None = None,
    on_fallback: FallbackHook | None = None,
) -> ModelRoutes:
    """Upstreams and counters for the top level and each model, shared where equal;
    ``on_error`` counts every upstream's failures (``Upstream``); ``engines`` gives the
    factory of an upstream's engines (``proxy.fleet``), plain ``Engine`` without;
    ``on_retry`` and ``on_fallback`` count the transport's retries and what the
    counters left to the estimate.

    On failure everything built so far is closed before the error goes up.
    """
    upstreams: dict[tuple[str, str | None], Upstream] = {}
    windows: dict[tuple[str, str | None], ContextWindows] = {}
    counters: dict[tuple[str, tuple[str, str | None] | None], TokenCounter] = {}

    async def route(name: str | None, s: Settings) -> ModelRoute:
        ukey = _upstream_key(s)
        upstream = upstreams.get(ukey)
        if upstream is None:
            factory = engines(s) if engines is not None else Engine
            upstream = upstreams[ukey] = Upstream(
                s, on_error=on_error, on_retry=on_retry, engine_factory=factory
            )
            windows[ukey] = ContextWindows(upstream, s)
        # hf: and tiktoken: count the same whichever upstream serves the model.
        asks_upstream = s.tokenizer in ("auto", "upstream")
        ckey = (s.tokenizer, ukey if asks_upstream else None)
        counter = counters.get(ckey)
        if counter is None:
            counter = counters[ckey] = await build_counter(s, upstream, on_fallback)
        return ModelRoute(name, s, upstream, windows[ukey], counter)

    try:
        default = await route(None, settings)
        by_name = {m.name: await route(m.name, m.settings) for m in models}
    except BaseException:
        for counter in counters.values():
            await counter.aclose()
        for upstream in upstreams.values():
            await upstream.aclose()
        raise
    for m in models:
        r = by_name[m.name]
        log.info(
            "model %s: upstream %s, tokenizer %s", m.name, r.settings.upstream_url, r.counter.name
        )
    return ModelRoutes(default, by_name, tuple(upstreams.values()), tuple(counters.values()))


def union_models(bodies: Sequence[bytes]) -> bytes | None:
    """The ``/v1/models`` bodies of several upstreams as one list (first id wins);
    None when none of them is a model list."""
    merged: dict[str, Any] | None = None
    seen: set[str] = set()
    data: list[Any] = []
    for raw in bodies:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        entries = body.get("data") if isinstance(body, dict) else None
        if not isinstance(entries, list):
            continue
        if merged is None:
            merged = body
        for entry in entries:
            ident = entry.get("id") if isinstance(entry, dict) else None
            if isinstance(ident, str) and ident not in seen:
                seen.add(ident)
                data.append(entry)
    if merged is None:
        return None
    return orjson.dumps({**merged, "data": data})
