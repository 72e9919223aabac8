"""What the lifespan builds once, and the typed accessor handlers use to read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.requests import Request

from proxy.metrics import Metrics
from proxy.settings import Settings
from proxy.tokens.counter import TokenCounter
from proxy.upstream import ContextWindows, Upstream

if TYPE_CHECKING:
    from proxy.admission import KvAdmission
    from proxy.sessions.gate import Sessions


@dataclass(slots=True)
class Services:
    settings: Settings
    metrics: Metrics
    upstream: Upstream
    windows: ContextWindows
    counter: TokenCounter
    sessions: Sessions | None
    admission: KvAdmission | None = None
    """The KV ledger's gate; None when ``TRIMPROXY_KV_ADMISSION=off``."""


def services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc
