"""What the sim received, kept for tests to inspect over ``GET /_sim/requests``.

Recording is a few attribute stores per request; decoding the body for display
happens only when a test asks.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson


@dataclass(eq=False, slots=True)
class Record:
    seq: int
    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]
    body: bytes
    received_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    status: int | None = None
    stream: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    #: The client closed the connection before the answer was complete.
    disconnected: bool = False
    #: The request target as it came off the wire (path and query, undecoded).
    raw_path: str = ""
    #: Prompt tokens the prefix cache supplied (vLLM's ``cached_tokens``).
    cached_tokens: int | None = None
    #: The sim clock's seconds from receipt to the first generated token.
    ttft_seconds: float | None = None
    #: Times the request was preempted (``--preempt``) and recomputed.
    preemptions: int = 0

    def as_json(self) -> dict[str, Any]:
        try:
            parsed: Any = orjson.loads(self.body) if self.body else None
        except orjson.JSONDecodeError:
            parsed = None
        if parsed is not None:
            try:
                # orjson reads 1024 levels of nesting but writes fewer than 255: a body
                # it cannot write back is shown as text only, so the listing never fails.
                orjson.dumps([[parsed]])  # as deep as it sits in the listing
            except orjson.JSONEncodeError:
                parsed = None
        return {
            "seq": self.seq,
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "headers": [list(pair) for pair in self.headers],
            "body": self.body.decode("utf-8", "replace"),
            "json": parsed,
            "received_at": self.received_at,
            "ended_at": self.ended_at,
            "status": self.status,
            "stream": self.stream,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "disconnected": self.disconnected,
            "raw_path": self.raw_path,
            "cached_tokens": self.cached_tokens,
            "ttft_seconds": self.ttft_seconds,
            "preemptions": self.preemptions,
        }


class Recorder:
    """A bounded ring of ``Record``; the oldest fall off."""

    def __init__(self, limit: int) -> None:
        self._records: deque[Record] = deque(maxlen=limit)
        self._seq = 0

    def add(
        self,
        method: str,
        path: str,
        query: str,
        headers: list[tuple[str, str]],
        body: bytes,
        raw_path: str = "",
    ) -> Record:
        self._seq += 1
        record = Record(self._seq, method, path, query, headers, body, raw_path=raw_path)
        self._records.append(record)
        return record

    def snapshot(self) -> list[dict[str, Any]]:
        return [r.as_json() for r in self._records]

    def clear(self) -> None:
        self._records.clear()
