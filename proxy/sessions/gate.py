"""The session step of the chat route (docs/architecture.md §10): identify the session, ask the
store, apply the limit action, and name the response headers.

``build_sessions`` builds the gate from the settings, or nothing when no limit is set.
The rule itself is ``proxy.sessions.rule``; the stores are ``memory`` and
``redis_store``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from proxy.choices import Endpoint
from proxy.errors import ProxyError, SessionExpired, SessionStoreUnavailable, SessionTurnLimit
from proxy.metrics import Metrics
from proxy.series import CounterChild
from proxy.sessions.identity import Identity, hash_conversation
from proxy.sessions.memory import MemoryStore
from proxy.sessions.rule import Decision, Limits
from proxy.sessions.store import SessionStore, StoreUnavailable
from proxy.sessions.types import DEFAULT_SESSION_HEADER, StoreFailure
from proxy.settings import Settings
from proxy.types import Message

log = logging.getLogger("trimproxy.sessions")


@dataclass(frozen=True, slots=True)
class Admission:
    history_start: int = 0
    """Index into the request's messages before which the session dropped history."""
    headers: Mapping[str, str] = field(default_factory=dict)


SESSION_ID = "x-trimproxy-session-id"
SESSION_TURN = "x-trimproxy-session-turn"
SESSION_RESET = "x-trimproxy-session-reset"


class Sessions:
    """The session step of the chat route: identify, ask the store, apply the action."""

    def __init__(
        self,
        store: SessionStore,
        limits: Limits,
        metrics: Metrics,
        *,
        header: str = DEFAULT_SESSION_HEADER,
        failure: StoreFailure = "open",
    ) -> None:
        self.store = store
        self.limits = limits
        self.metrics = metrics
        self.header = header
        self.failure = failure
        # The counter's child of each (reason, endpoint) a limit was hit on, bound once.
        self._limit_hits: dict[tuple[str, Endpoint], CounterChild] = {}

    async def start(self) -> None:
        """Say at start-up where the state lives; an unreachable store is not fatal."""
        reachable = await self.store.ping()
        log.log(
            logging.INFO if reachable else logging.WARNING,
            "session limits on (max_turns=%s, max_age=%s s, action=%s); store %s%s",
            self.limits.max_turns,
            self.limits.max_age,
            self.limits.action,
            self.store.name,
            "" if reachable else f" is not reachable yet (on failure: {self.failure})",
        )

    async def admit(
        self, ident: Identity, messages: Sequence[Message], endpoint: Endpoint = "chat"
    ) -> Admission:
        """The session step of a request of ``messages`` (the conversation trimming
        sees), whose identity ``prepare`` worked out (``identify``, once a request),
        that came in by ``endpoint`` (the limit counter's label)."""
        headers = {SESSION_ID: ident.shown}
        conversation = hash_conversation(messages)
        if conversation.user_turns == 0:
            return Admission(0, headers)  # no user turn yet: nothing to count
        try:
            decision = await self.store.admit(ident.key, conversation, self.limits)
        except StoreUnavailable:
            self.metrics.session_store_errors.inc()
            if self.failure == "closed":
                raise SessionStoreUnavailable(
                    f"The session store ({self.store.name}) is unavailable, and this proxy "
                    "refuses requests it cannot check (TRIMPROXY_SESSION_STORE_FAILURE=closed). "
                    "Retry in a few seconds.",
                    headers={"retry-after": "1"},
                ) from None
            return Admission(0, headers)  # open: served without session limits
        held = self.store.held()
        if held is not None:
            self.metrics.sessions_held.set(held)
        if decision.reason is not None:
            self._limit_hit(decision.reason, endpoint)
        if decision.outcome == "reject":
            raise self._rejection(decision, ident.shown, headers)
        headers[SESSION_TURN] = str(decision.turn)
        if decision.outcome == "reset":
            headers[SESSION_RESET] = "1"
        start = conversation.user_starts[decision.base] if decision.base else 0
        return Admission(start, headers)

    def _limit_hit(self, reason: str, endpoint: Endpoint) -> None:
        child = self._limit_hits.get((reason, endpoint))
        if child is None:
            child = self.metrics.session_limits.labels(reason, self.limits.action, endpoint)
            self._limit_hits[(reason, endpoint)] = child
        child.inc()

    def _rejection(self, decision: Decision, shown: str, headers: dict[str, str]) -> ProxyError:
        advice = "Start a new conversation: a request with one user message opens a new session."
        if decision.reason == "turns":
            return SessionTurnLimit(
                f"Session {shown} is at user turn {decision.turn}, over its limit of "
                f"{self.limits.max_turns} turns (TRIMPROXY_SESSION_MAX_TURNS). {advice}",
                param="messages",
                headers=headers,
            )
        return SessionExpired(
            f"Session {shown} started {decision.age:.1f} s ago, over its limit of "
            f"{self.limits.max_age:g} s (TRIMPROXY_SESSION_MAX_AGE). {advice}",
            param="messages",
            headers=headers,
        )

    async def aclose(self) -> None:
        await self.store.aclose()


def build_sessions(settings: Settings, metrics: Metrics) -> Sessions | None:
    """The gate, or None when no limit is set: then the session step costs nothing."""
    if settings.session_max_turns is None and settings.session_max_age is None:
        return None
    limits = Limits(
        max_turns=settings.session_max_turns,
        max_age=settings.session_max_age,
        action=settings.session_limit_action,
        idle_ttl=settings.session_idle_ttl,
    )
    store: SessionStore
    if settings.redis_url:
        from proxy.sessions.redis_store import RedisStore  # redis is imported only when used

        store = RedisStore(settings.redis_url, failure=settings.session_store_failure)
    else:
        if settings.workers > 1:
            log.warning(
                "each of the %d workers holds its own sessions: set "
                "TRIMPROXY_REDIS_URL for one view",
                settings.workers,
            )
        store = MemoryStore(settings.session_max_entries)
    return Sessions(
        store,
        limits,
        metrics,
        header=settings.session_header,
        failure=settings.session_store_failure,
    )
