"""Session identity and limits (DESIGN section 4)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from starlette.requests import Request

from proxy.chat import ChatRequest


@dataclass(frozen=True, slots=True)
class Admission:
    history_start: int = 0
    """Index into the request's messages before which the session dropped history."""
    headers: Mapping[str, str] = field(default_factory=dict)


class Sessions:
    async def admit(self, request: Request, chat: ChatRequest) -> Admission:
        raise NotImplementedError

    async def aclose(self) -> None:
        return None
