"""What the lifespan builds once, and the typed accessor handlers use to read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.requests import Request

from proxy.metrics import Metrics
from proxy.settings import Settings
from proxy.types import TokenCounter
from proxy.upstream import ContextWindows, Upstream

if TYPE_CHECKING:
    from proxy.sessions import Sessions


@dataclass(slots=True)
class Services:
    settings: Settings
    metrics: Metrics
    upstream: Upstream
    windows: ContextWindows
    counter: TokenCounter
    sessions: Sessions | None
    pass_auth: bool
    """Whether the client's Authorization may travel upstream (open proxy, no upstream key)."""


def services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc
