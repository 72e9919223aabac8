"""Session limits (DESIGN section 4): the rule, the store Protocol, the in-memory store.

A session's turn number is derived from the request (user messages after the
session's reset point), never counted up by the store, so a retried or duplicated
request cannot count twice, and 40 concurrent copies of one request cause one reset.
What the store keeps per session is small and bounded: when it started and up to
``MAX_RESET_POINTS`` reset points, each a user-message index plus the hash of the
conversation before it (``proxy.fingerprint``). A request follows the latest reset
point whose hash matches its own prefix; conversations that share a session id but
not that prefix are not moved by it.

``decide`` is the rule; ``proxy/redis_store.py`` runs the same rule as a Lua script.
``Sessions`` is the gate the chat route calls: identity, store, limits, headers.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from starlette.requests import Request

from proxy.chat import ChatRequest
from proxy.errors import ProxyError, SessionExpired, SessionStoreUnavailable, SessionTurnLimit
from proxy.fingerprint import Probe, conversation_probe, identify
from proxy.metrics import Metrics
from proxy.settings import Settings

log = logging.getLogger("trimproxy.sessions")

#: Reset points kept per session: one per conversation that shares the session id.
MAX_RESET_POINTS = 4

Outcome = Literal["pass", "reset", "reject"]
Reason = Literal["turns", "age"]


class StoreUnavailable(Exception):
    """The store could not answer; the gate applies TRIMPROXY_SESSION_STORE_FAILURE."""


@dataclass(frozen=True, slots=True)
class Limits:
    max_turns: int | None
    max_age: float | None
    action: Literal["reset", "reject"]
    idle_ttl: float


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Outcome
    base: int
    """Index, among the request's user messages, of the turn the session (re)started at."""
    turn: int
    """1-based user turn since ``base``."""
    reason: Reason | None
    age: float
    """Seconds since the session (or its latest reset) started, before this request."""


@dataclass(slots=True)
class ResetPoint:
    user_index: int
    prefix_hash: str
    started: float


@dataclass(slots=True)
class State:
    started: float
    resets: list[ResetPoint] = field(default_factory=list)


def decide(state: State | None, probe: Probe, limits: Limits, now: float) -> tuple[State, Decision]:
    """Apply the limits to one request; returns the state to keep and the decision.

    ``probe.user_turns`` must be at least 1. A request with one user message never
    hits a limit: on a session past its age it starts the clock anew (a client told
    to open a new conversation did so). On a live session it leaves the clock alone,
    so that new conversations under one id do not keep an old one young.
    """
    if state is None:
        state = State(started=now)
    users = probe.user_turns
    matches = [
        p
        for p in state.resets
        if p.user_index < users and p.prefix_hash == probe.prefix_hash(p.user_index)
    ]
    best = max(matches, key=lambda p: p.user_index, default=None)
    expired = limits.max_age is None or now - state.started > limits.max_age
    if best is None and users == 1 and expired:
        state.started = now
    base, started = (best.user_index, best.started) if best else (0, state.started)
    turn = users - base
    age = now - started
    reason: Reason | None = None
    if limits.max_turns is not None and turn > limits.max_turns:
        reason = "turns"
    elif limits.max_age is not None and age > limits.max_age:
        reason = "age"
    if reason is None:
        return state, Decision("pass", base, turn, None, age)
    if limits.action == "reject":
        return state, Decision("reject", base, turn, reason, age)
    # Reset at the current user turn; it replaces the point it grew from, so one
    # conversation holds one point however often it resets.
    point = ResetPoint(users - 1, probe.prefix_hash(users - 1), now)
    if best is not None:
        state.resets.remove(best)
    state.resets.append(point)
    del state.resets[:-MAX_RESET_POINTS]
    return state, Decision("reset", users - 1, 1, reason, age)


class SessionStore(Protocol):
    """Runs ``decide`` for one session atomically: read, check and update as one step."""

    name: str

    async def admit(self, key: str, probe: Probe, limits: Limits) -> Decision: ...

    def held(self) -> int | None: ...  # sessions held here, for the gauge; None if shared

    async def ping(self) -> bool: ...

    async def aclose(self) -> None: ...


class MemoryStore:
    """Per-process store, bounded by count (LRU) and by idle time.

    ``admit`` has no ``await`` between read and write, so on one event loop it is
    atomic. With several workers each has its own view: use Redis there.
    """

    name = "memory"

    def __init__(self, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.clock = clock
        # key -> (state, last use); ordered by last use, oldest first.
        self._entries: OrderedDict[str, tuple[State, float]] = OrderedDict()

    async def admit(self, key: str, probe: Probe, limits: Limits) -> Decision:
        now = self.clock()
        self._expire(now, limits.idle_ttl)
        held = self._entries.pop(key, None)
        state, decision = decide(held[0] if held else None, probe, limits, now)
        self._entries[key] = (state, now)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return decision

    def _expire(self, now: float, ttl: float) -> None:
        # Oldest use first: stop at the first entry still alive.
        while self._entries:
            key, (_, last) = next(iter(self._entries.items()))
            if now - last <= ttl:
                break
            del self._entries[key]

    def state(self, key: str) -> State | None:
        held = self._entries.get(key)
        return held[0] if held else None

    def held(self) -> int | None:
        return len(self._entries)

    async def ping(self) -> bool:
        return True

    async def aclose(self) -> None:
        self._entries.clear()


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
        header: str = "X-Session-ID",
        failure: Literal["open", "closed"] = "open",
    ) -> None:
        self.store = store
        self.limits = limits
        self.metrics = metrics
        self.header = header
        self.failure = failure

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

    async def admit(self, request: Request, chat: ChatRequest) -> Admission:
        ident = identify(request.headers, self.header, chat.user, chat.messages)
        headers = {SESSION_ID: ident.shown}
        conversation = conversation_probe(chat.messages)
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
            self.metrics.session_limits.labels(decision.reason, self.limits.action).inc()
        if decision.outcome == "reject":
            raise self._rejection(decision, ident.shown, headers)
        headers[SESSION_TURN] = str(decision.turn)
        if decision.outcome == "reset":
            headers[SESSION_RESET] = "1"
        start = conversation.user_starts[decision.base] if decision.base else 0
        return Admission(start, headers)

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
        from proxy.redis_store import RedisStore  # redis is imported only when used

        store = RedisStore(settings.redis_url, failure=settings.session_store_failure)
    else:
        if settings.workers > 1:
            log.warning("each of the %d workers holds its own sessions: set "
                        "TRIMPROXY_REDIS_URL for one view", settings.workers)  # fmt: skip
        store = MemoryStore(settings.session_max_entries)
    return Sessions(
        store,
        limits,
        metrics,
        header=settings.session_header,
        failure=settings.session_store_failure,
    )
