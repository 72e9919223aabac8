"""What the lifespan builds once, and the typed accessor handlers use to read it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from starlette.requests import Request

from proxy.admission import KvAdmission
from proxy.chains.keeper import Keeper
from proxy.engines.engine import Engine
from proxy.metrics import Metrics
from proxy.sessions.gate import Sessions
from proxy.settings import Settings
from proxy.tokens.counter import TokenCounter
from proxy.upstream import ContextWindows, Upstream


@dataclass(slots=True)
class Services:
    settings: Settings
    metrics: Metrics
    upstream: Upstream
    windows: ContextWindows
    counter: TokenCounter
    sessions: Sessions | None
    keeper: Keeper | None = None
    """The Responses API's stored responses (``proxy.chains``), built by the lifespan."""
    gates: Mapping[Engine, KvAdmission] = field(default_factory=dict)
    """Each engine's KV gate where admission is on (``proxy.fleet``)."""
    by_model: Mapping[str, Services] = field(default_factory=dict)
    """``TRIMPROXY_MODELS_FILE``: each named model's own settings, upstream, window and
    counter (``proxy.models``); a model it does not name is served by this one."""
    model_label: str | None = None
    """The ``model`` metric label of a named model's services; None on the top level,
    where it is the request's model if an upstream lists it, else ``other``."""
    upstreams: tuple[Upstream, ...] = ()
    """Every distinct upstream when a models file names more than one, or the top level
    has several engines (``/v1/models`` is the union of every engine's); else empty."""

    def for_model(self, model: str | None) -> Services:
        """The services that serve ``model``: its own from the models file, or these."""
        if model is None or not self.by_model:
            return self
        return self.by_model.get(model, self)

    def routes_by_session(self) -> bool:
        """Whether requests are routed by their session: ``TRIMPROXY_ROUTING=session``
        over more than one live engine (a lone engine is never routed, and asking it
        costs nothing: docs/performance.md §6)."""
        upstream = self.upstream
        return (
            self.settings.routing == "session"
            and upstream.lone is None
            and len(upstream.engines.live()) >= 2
        )

    def needs_session_key(self) -> bool:
        """Whether a prompt request needs its session identity: for the session limits,
        or to route it by its session."""
        if self.sessions is not None:
            return True
        # A lone engine is never routed: asked first, it spares the rest on every request.
        return self.upstream.lone is None and self.routes_by_session()


def services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc
