"""The conversations of one arm: ``--conversations`` clients talking at once.

Each client (a *lane*) keeps its conversation's whole history, the way a chat UI
does, and adds about ``--turn-tokens`` of seeded user text per turn; the proxy, not
the client, decides what reaches the engine. Every conversation sends its own id in
``--session-header``. When a request fails, that conversation is over, as it would be
for a person in a chat UI: the lane opens a new one (new id, empty history) after a
short pause that grows while failures repeat, so a dead server is not hammered.

Lanes start a fraction of a second apart (seeded), so that their turns do not all
land on the engine in the same instant.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from proxy.soak.client import ChatClient, ChatResult
from proxy.soak.options import Arm, SoakOptions
from proxy.soak.records import RequestRecord
from proxy.soak.text import system_prompt, user_text

OnRecord = Callable[[RequestRecord], None]

_MAX_PAUSE = 5.0
_PROMPT_HEADER = "x-trimproxy-prompt-tokens"
_TRIMMED_HEADER = "x-trimproxy-trimmed-messages"
_TURN_HEADER = "x-trimproxy-session-turn"
_RESET_HEADER = "x-trimproxy-session-reset"


def _int_header(headers: dict[str, str], name: str) -> int | None:
    try:
        return int(headers[name])
    except (KeyError, ValueError):
        return None


class ArmDriver:
    """Runs the seeded load against one arm until its turns or its time are spent."""

    def __init__(self, options: SoakOptions, arm: Arm, run_id: str, on_record: OnRecord) -> None:
        self.options = options
        self.arm = arm
        self.run_id = run_id
        self.on_record = on_record
        self.started = 0.0
        self._client: ChatClient | None = None
        #: Whether the arm's URL is a trimproxy (it names what it forwarded); ``None``
        #: until the first answer says.
        self.proxied: bool | None = None

    def _deadline_passed(self) -> bool:
        duration = self.options.duration
        return duration is not None and time.monotonic() - self.started >= duration

    async def run(self, started: float) -> float:
        """Drive every lane to its end; ``started`` is the arm's ``time.monotonic()``
        origin (the sampler's too). Returns the arm's wall time in seconds."""
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=10.0, sock_read=self.options.request_timeout
        )
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            self._client = ChatClient(session, self.arm.url, self.options.headers())
            self.started = started
            await asyncio.gather(*(self._lane(i) for i in range(self.options.conversations)))
            return time.monotonic() - self.started

    async def _lane(self, lane: int) -> None:
        assert self._client is not None
        options = self.options
        rng = random.Random(f"trimproxy-soak-lane:{options.seed}:{lane}")
        await asyncio.sleep(rng.uniform(0.0, 1.0))
        restart, turn, sent, failures = 0, 0, 0, 0
        history = self._fresh_history()
        while not self._deadline_passed() and (options.turns is None or sent < options.turns):
            turn += 1
            sent += 1
            text = user_text(options.seed, f"{lane}.{restart}", turn, options.turn_tokens)
            history.append({"role": "user", "content": text})
            session_id = f"soak-{self.run_id}-{self.arm.index}-{lane}-{restart}"
            record, result = await self._request(lane, restart, turn, history, session_id)
            self.on_record(record)
            if result.ok:
                failures = 0
                history.append({"role": "assistant", "content": result.content})
                continue
            failures += 1
            restart, turn = restart + 1, 0
            history = self._fresh_history()
            await asyncio.sleep(min(_MAX_PAUSE, 0.25 * 2 ** (failures - 1)))

    def _fresh_history(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": system_prompt(self.run_id, self.arm.index)}]

    async def _request(
        self,
        lane: int,
        restart: int,
        turn: int,
        history: list[dict[str, Any]],
        session_id: str,
    ) -> tuple[RequestRecord, ChatResult]:
        assert self._client is not None
        body = {
            "model": self.options.model,
            "messages": list(history),
            "max_tokens": self.options.max_tokens,
        }
        # The history's size is counted beside the request, not before it, so that
        # counting does not slow the lane down; an arm found to be the engine itself
        # is not asked: what the engine counted is what the client sent.
        counting = None
        if self.proxied is not False:
            counting = asyncio.ensure_future(self._client.count(body))
        start = time.monotonic() - self.started
        result = await self._client.chat(body, {self.options.session_header: session_id})
        headers = result.headers
        forwarded = _int_header(headers, _PROMPT_HEADER)
        if result.ok and self.proxied is None:
            self.proxied = forwarded is not None
        sent_tokens = await counting if counting is not None else None
        if sent_tokens is None and self.proxied is False:
            sent_tokens = result.prompt_tokens
        record = RequestRecord(
            arm=self.arm.name,
            conversation=lane,
            restart=restart,
            turn=turn,
            start=round(start, 4),
            status=result.status,
            error=result.error,
            error_key=None if result.ok else result.error_key,
            sent_prompt_tokens=sent_tokens,
            forwarded_prompt_tokens=forwarded if forwarded is not None else result.prompt_tokens,
            usage_prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            latency_seconds=round(result.latency, 4),
            ttft_seconds=None if result.ttft is None else round(result.ttft, 4),
            session_id=session_id,
            session_turn=_int_header(headers, _TURN_HEADER),
            session_reset=headers.get(_RESET_HEADER) == "1",
            trimmed_messages=_int_header(headers, _TRIMMED_HEADER),
        )
        return record, result
