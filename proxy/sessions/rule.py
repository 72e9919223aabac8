"""The session rule: one pure function from (state, request, limits, now) to a decision.

A session's turn number is derived from the request (user messages after the
session's reset point), never counted up by the store, so a retried or duplicated
request cannot count twice, and 40 concurrent copies of one request cause one reset.
What a store keeps per session is small and bounded: when it started and up to
``MAX_RESET_POINTS`` reset points, each a user-message index plus the hash of the
conversation before it (``proxy.sessions.identity``). A request follows the latest
reset point whose hash matches its own prefix; conversations that share a session id
but not that prefix are not moved by it.

``decide`` is the rule; ``proxy/sessions/redis_store.py`` runs the same rule as a Lua
script (their parity is tested).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.sessions.identity import ConversationHashes
from proxy.sessions.types import LimitAction, Outcome, Reason

#: Reset points kept per session: one per conversation that shares the session id.
MAX_RESET_POINTS = 4


@dataclass(frozen=True, slots=True)
class Limits:
    max_turns: int | None
    max_age: float | None
    action: LimitAction
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


def decide(
    state: State | None, hashes: ConversationHashes, limits: Limits, now: float
) -> tuple[State, Decision]:
    """Apply the limits to one request; returns the state to keep and the decision.

    ``hashes.user_turns`` must be at least 1. A request with one user message never
    hits a limit: on a session past its age it starts the clock anew (a client told
    to open a new conversation did so). On a live session it leaves the clock alone,
    so that new conversations under one id do not keep an old one young.
    """
    if state is None:
        state = State(started=now)
    users = hashes.user_turns
    matches = [
        p
        for p in state.resets
        if p.user_index < users and p.prefix_hash == hashes.prefix_hash(p.user_index)
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
    point = ResetPoint(users - 1, hashes.prefix_hash(users - 1), now)
    if best is not None:
        state.resets.remove(best)
    state.resets.append(point)
    del state.resets[:-MAX_RESET_POINTS]
    return state, Decision("reset", users - 1, 1, reason, age)
