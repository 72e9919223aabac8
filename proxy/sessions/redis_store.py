"""Session store in Redis, shared by every replica (docs/architecture.md §10, §18).

Each request is one round trip: ``EVALSHA`` of a Lua script that reads the session,
applies the rule of ``proxy.sessions.rule.decide`` and writes it back with its idle TTL.
Redis runs a script atomically, so concurrent requests of one session on any number
of replicas see one another's updates in some order and agree. Time comes from
Redis (``TIME``), so replicas with skewed clocks still agree on a session's age.

State per session is one string key, ``trimproxy:session:<ns>:<kind>:<hash>``:
``started;idx,hash,started;...`` with times in ms and at most ``MAX_RESET_POINTS``
reset points, so well under 200 bytes.

When Redis is down, requests must not each wait for it: each check has a short
deadline (``timeout``, 0.5 s), and after a failure the store answers
``StoreUnavailable`` at once for ``retry_interval`` seconds before it tries again.
The outage is logged when it starts, at most once per ``log_interval`` while it
lasts, and when it ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from proxy.redis_client import FAILURES, answers, connect
from proxy.sessions.identity import HASH_HEX, ConversationHashes
from proxy.sessions.rule import MAX_RESET_POINTS, Decision, Limits
from proxy.sessions.store import StoreUnavailable
from proxy.sessions.types import Outcome, Reason, StoreFailure

log = logging.getLogger("trimproxy.sessions")

KEY_PREFIX = "trimproxy:session:"

# ARGV: user turns, prefix hashes (HASH_HEX hex chars each), max turns (0: none),
# max age ms (0: none), action, idle ttl ms, reset points kept, HASH_HEX.
# Returns {outcome (0 pass, 1 reset, 2 reject), base, turn, reason (0, 1 turns, 2 age), age ms}.
ADMIT_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local users, hashes = tonumber(ARGV[1]), ARGV[2]
local max_turns, max_age = tonumber(ARGV[3]), tonumber(ARGV[4])
local ttl, keep, w = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local function h(i) return string.sub(hashes, i * w + 1, (i + 1) * w) end

local started, points = nil, {}
local raw = redis.call('GET', KEYS[1])
if raw then
  for part in string.gmatch(raw, '[^;]+') do
    if started == nil then
      started = tonumber(part)
    else
      local i, hh, s = string.match(part, '^(%d+),(%x+),(%d+)$')
      if i then table.insert(points, {tonumber(i), hh, tonumber(s)}) end
    end
  end
end
if started == nil then started = now end

local best = 0
for k, p in ipairs(points) do
  if p[1] < users and p[2] == h(p[1]) and (best == 0 or p[1] > points[best][1]) then
    best = k
  end
end
if best == 0 and users == 1 and (max_age == 0 or now - started > max_age) then
  started = now  -- a new conversation on an expired session: the session starts anew
end
local base, since = 0, started
if best > 0 then base, since = points[best][1], points[best][3] end
local turn, age = users - base, now - since

local reason, outcome = 0, 0
if max_turns > 0 and turn > max_turns then reason = 1
elseif max_age > 0 and age > max_age then reason = 2 end
if reason > 0 then
  if ARGV[5] == 'reject' then
    outcome = 2
  else
    outcome = 1
    if best > 0 then table.remove(points, best) end
    table.insert(points, {users - 1, h(users - 1), now})
    while #points > keep do table.remove(points, 1) end
    base, turn = users - 1, 1
  end
end

local out = {string.format('%.0f', started)}
for _, p in ipairs(points) do
  table.insert(out, string.format('%d,%s,%.0f', p[1], p[2], p[3]))
end
redis.call('SET', KEYS[1], table.concat(out, ';'), 'PX', ttl)
return {outcome, base, turn, reason, age}
"""

_OUTCOMES: dict[int, Outcome] = {0: "pass", 1: "reset", 2: "reject"}
_REASONS: dict[int, Reason | None] = {0: None, 1: "turns", 2: "age"}


class RedisStore:
    name = "redis"

    def __init__(
        self,
        url: str,
        *,
        failure: StoreFailure = "open",
        timeout: float = 0.5,
        max_connections: int = 64,
        retry_interval: float = 1.0,
        log_interval: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client, target = connect(url, timeout, max_connections)
        self.script = self.client.register_script(ADMIT_LUA)
        self.timeout = timeout
        self.clock = clock
        self.outage = Outage(target, failure, retry_interval, log_interval)

    async def admit(self, key: str, hashes: ConversationHashes, limits: Limits) -> Decision:
        now = self.clock()
        if self.outage.skip(now):
            raise StoreUnavailable(self.outage.target)
        args = (
            hashes.user_turns,
            hashes.prefix_hashes,
            limits.max_turns or 0,
            round(limits.max_age * 1000) if limits.max_age else 0,
            limits.action,
            max(1, round(limits.idle_ttl * 1000)),
            MAX_RESET_POINTS,
            HASH_HEX,
        )
        try:
            # One deadline for the whole check; redis-py drops a connection whose read
            # was cancelled, so a late reply never lands on the next command.
            async with asyncio.timeout(self.timeout):
                raw = await self.script(keys=[KEY_PREFIX + key], args=args)
        except FAILURES as exc:
            self.outage.failed(self.clock(), exc)
            raise StoreUnavailable(self.outage.target) from exc
        self.outage.recovered(self.clock())
        outcome, base, turn, reason, age_ms = (int(v) for v in raw)
        return Decision(_OUTCOMES[outcome], base, turn, _REASONS[reason], age_ms / 1000)

    def held(self) -> int | None:
        return None  # shared state: the gauge of one replica would mislead

    async def ping(self) -> bool:
        if not await answers(self.client, self.timeout):
            return False
        # Answered: requests ask it again now, not after the outage's retry interval,
        # so that a /readyz that says ready is what the next request meets.
        self.outage.recovered(self.clock())
        return True

    async def aclose(self) -> None:
        await self.client.aclose()


class Outage:
    """Fails fast while the store is down, and logs per interval, not per request."""

    def __init__(
        self, target: str, failure: StoreFailure, retry_interval: float, log_interval: float
    ) -> None:
        self.target = target
        self.failure = failure
        self.retry_interval = retry_interval
        self.log_interval = log_interval
        self.down_since: float | None = None
        self.retry_at = 0.0
        self.logged_at = 0.0
        self.unchecked = 0
        """Requests without a session check since the last log line."""

    def skip(self, now: float) -> bool:
        if self.down_since is None or now >= self.retry_at:
            return False
        self.unchecked += 1
        self._report(now)
        return True

    def failed(self, now: float, exc: BaseException) -> None:
        self.unchecked += 1
        self.retry_at = now + self.retry_interval
        if self.down_since is None:
            self.down_since = self.logged_at = now
            self.unchecked = 0
            action = "serving without session limits" if self.failure == "open" else "answering 503"
            log.warning(
                "session store %s unavailable (%s); %s (TRIMPROXY_SESSION_STORE_FAILURE=%s), "
                "retrying every %g s",
                self.target,
                type(exc).__name__,
                action,
                self.failure,
                self.retry_interval,
            )
        else:
            self._report(now)

    def _report(self, now: float) -> None:
        if self.down_since is not None and now - self.logged_at >= self.log_interval:
            log.warning(
                "session store %s still unavailable after %.0f s; %d requests unchecked since "
                "the last report",
                self.target,
                now - self.down_since,
                self.unchecked,
            )
            self.logged_at = now
            self.unchecked = 0

    def recovered(self, now: float) -> None:
        if self.down_since is not None:
            log.warning(
                "session store %s is back after %.1f s; session limits apply again",
                self.target,
                now - self.down_since,
            )
            self.down_since = None
            self.unchecked = 0
