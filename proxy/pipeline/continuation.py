"""Continuing a streamed answer whose engine broke off (docs/architecture.md §23).

While a continuable stream is relayed, ``SoFar`` keeps its bytes (a list append per
chunk) and notices the engine's own error event. When the stream breaks before its
end, ``Partial`` reads what the client was sent: the answer's head (``id``,
``created``, ``model``), its text, the tokens generated, and whether it can go on at
all (one choice, no logprobs, no tool call or reasoning begun, whole events only).
``continued_body`` is the request once more with that text as a final assistant
message in vLLM's continuation form (``continue_final_message: true``,
``add_generation_prompt: false``) and what was left of ``max_tokens``; ``Reframe``
makes the new engine's events part of the same answer: the first answer's head, no
second role delta, usage that counts the prompt once and both parts' completion
tokens. ``Continuation`` ties these together for the relay; moving the answer to the
next engine (its reservation, the session) is the forward step's (``proxy.pipeline.forward``).
These three make chat's ``Form``; the Responses dialect has its own
(``proxy.pipeline.continuation_responses``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Self

import aiohttp
import orjson

from proxy.logs import RequestFacts
from proxy.metrics import Metrics

log = logging.getLogger("trimproxy.upstream")

#: Why a stream was continued: the ``reason`` label of ``trimproxy_answers_continued_total``.
REASONS = ("reset", "timeout", "error_event")

_ERROR = b'{"error"'  # vLLM's error event; inside a JSON string the quotes are escaped
_DONE = b"[DONE]"


class EngineErrorEvent(Exception):
    """The engine streamed its own error event: ``head``, the bytes before it (relayed),
    ``rest``, the event and what followed it in the chunk."""

    def __init__(self, head: bytes, rest: bytes) -> None:
        super().__init__("the engine streamed an error event")
        self.head = head
        self.rest = rest


#: What breaks a relayed stream; the relay catches these.
BROKEN = (TimeoutError, aiohttp.ClientError, OSError, EngineErrorEvent)


def reason_of(exc: BaseException) -> str:
    if isinstance(exc, EngineErrorEvent):
        return "error_event"
    if isinstance(exc, TimeoutError):  # aiohttp's ServerTimeoutError is one
        return "timeout"
    return "reset"


def split_error(chunk: bytes) -> EngineErrorEvent | None:
    """The engine's error event in ``chunk``, split off; None when there is none."""
    at = chunk.find(_ERROR)
    if at < 0:
        return None
    start = chunk.rfind(b"data:", 0, at)
    start = at if start < 0 else start
    return EngineErrorEvent(chunk[:start], chunk[start:])


class SoFar:
    """The relayed bytes of one answer, kept for its continuation; ``then``: the hook
    the chunks go on to (the answer watch). Every ``COMPACT`` chunks the whole events
    kept are read into ``part`` and let go: a long answer holds its text, not its
    events' bytes."""

    COMPACT = 256

    __slots__ = ("chunks", "part", "then")

    def __init__(self, then: Callable[[bytes], None] | None, part: Partial | None = None) -> None:
        self.chunks: list[bytes] = []
        self.part = Partial() if part is None else part
        self.then = then

    def on_chunk(self, chunk: bytes) -> None:
        if _ERROR in chunk:
            error = split_error(chunk)
            if error is not None:
                self.keep(error.head)
                raise error
        self.keep(chunk)

    def keep(self, chunk: bytes) -> None:
        chunks = self.chunks
        chunks.append(chunk)
        if len(chunks) >= self.COMPACT:
            data = b"".join(chunks)
            end = data.rfind(b"\n\n") + 2
            self.part.feed(data[:end])
            self.chunks = [data[end:]] if end < len(data) else []
        if self.then is not None:
            self.then(chunk)

    def read(self) -> Partial:
        """All that was sent (``Partial.read``, from what compaction kept)."""
        data = b"".join(self.chunks)
        self.chunks = []
        self.part.feed(data)
        if data and not data.endswith(b"\n\n"):
            self.part.refused = "cut mid-event"
        return self.part


def events_of(data: bytes) -> list[bytes]:
    """The payloads of the ``data:`` lines of whole SSE events."""
    out = []
    for event in data.split(b"\n\n"):
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                out.append(line[5:].strip())
    return out


@dataclass(slots=True)
class Partial:
    """What a broken stream sent its client, as far as continuing it needs; read event
    by event (``feed``), so that ``SoFar`` need not keep a long answer's bytes."""

    head: dict[str, Any] = field(default_factory=dict)
    pieces: list[str] = field(default_factory=list)
    events: int = 0
    """Content events: one per decode step, as vLLM streams them."""
    counted: int | None = None
    """The completion tokens of the last usage the stream carried, if any."""
    finished: bool = False
    """The answer's finish reason (or ``[DONE]``) went out: nothing is left to generate."""
    refused: str | None = None
    """Why it cannot be continued (a word for the log), None when it can."""

    @classmethod
    def read(cls, data: bytes) -> Self:
        """The whole of what was sent, which must end with a whole event."""
        part = cls()
        part.feed(data)
        if data and not data.endswith(b"\n\n"):
            part.refused = "cut mid-event"
        return part

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def tokens(self) -> int:
        """Completion tokens generated: the last usage's count, else one per event."""
        return self.events if self.counted is None else self.counted

    def feed(self, data: bytes) -> None:
        """Whole events (a trailing part of one is left out)."""
        for payload in events_of(data[: data.rfind(b"\n\n") + 2]):
            if payload == _DONE:
                self.finished = True
                continue
            chunk = orjson.loads(payload)
            if not self.head:
                self.head = {k: chunk[k] for k in ("id", "created", "model") if k in chunk}
            usage = chunk.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                self.counted = usage["completion_tokens"]
            self._choices(chunk.get("choices") or [])

    def _choices(self, choices: list[Any]) -> None:
        for choice in choices:
            delta = choice.get("delta") or {}
            if choice.get("index", 0) != 0:
                self.refused = "n > 1"
            elif choice.get("logprobs") is not None:
                self.refused = "logprobs"
            elif delta.get("tool_calls"):
                self.refused = "tool call begun"
            elif delta.get("reasoning_content") or delta.get("reasoning"):
                self.refused = "reasoning begun"
            content = delta.get("content")
            if isinstance(content, str) and content:
                self.pieces.append(content)
                self.events += 1
            if choice.get("finish_reason") is not None:
                self.finished = True


def continued_body(body: bytes, text: str, tokens: int) -> bytes | None:
    """The request once more, ``text`` as the final assistant message to continue; None
    when its ``max_tokens`` is spent. Nothing generated yet: the request as it was."""
    if not text and not tokens:
        return body
    request = orjson.loads(body)
    messages = list(request.get("messages") or [])
    last = messages[-1] if messages else None
    if (
        request.get("continue_final_message")
        and isinstance(last, dict)
        and last.get("role") == "assistant"
        and isinstance(last.get("content"), str)
    ):
        messages[-1] = {**last, "content": last["content"] + text}  # the client's own prefix
    else:
        messages.append({"role": "assistant", "content": text})
    request["messages"] = messages
    request["continue_final_message"] = True
    request["add_generation_prompt"] = False
    for key in ("max_tokens", "max_completion_tokens"):
        limit = request.get(key)
        if isinstance(limit, int) and not isinstance(limit, bool):
            if limit - tokens < 1:
                return None
            request[key] = limit - tokens
    return orjson.dumps(request)


class Reframing:
    """Fed the new engine's chunks, gives the bytes to relay: its whole events, each
    re-framed by ``_event`` (a dialect's), up to an error event of the engine's."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = b""

    def _event(self, event: bytes) -> bytes:
        raise NotImplementedError

    def __call__(self, chunk: bytes) -> bytes:
        data = self._buffer + chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            self._buffer = data
            return b""
        self._buffer = data[end + 2 :]
        out: list[bytes] = []
        events = data[:end].split(b"\n\n")
        for i, event in enumerate(events):
            if _ERROR in event:
                rest = b"\n\n".join(events[i:]) + b"\n\n" + self._buffer
                raise EngineErrorEvent(b"".join(out), rest)
            framed = self._event(event)
            if framed:
                out.append(framed)
        return b"".join(out)


class Reframe(Reframing):
    """Chat's continuation events as part of the first answer (see the module's
    docstring)."""

    __slots__ = ("_head", "_opened", "_tokens")

    def __init__(self, part: Partial) -> None:
        super().__init__()
        self._head = part.head
        self._tokens = part.tokens
        # The client had the answer's opening event: the new engine's is dropped.
        self._opened = bool(part.head)

    def _event(self, event: bytes) -> bytes:
        payload = b"".join(events_of(event + b"\n\n"))
        if not payload:
            return b""  # a comment or a keep-alive of the new engine
        if payload == _DONE:
            return b"data: [DONE]\n\n"
        chunk = orjson.loads(payload)
        chunk.update(self._head)
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta")
            if self._opened and isinstance(delta, dict) and delta.pop("role", None) is not None:
                # The new engine's opening event: the client had its role delta already.
                opening = not delta.get("content") and len(delta) <= 1
                if opening and choice.get("finish_reason") is None:
                    return b""
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            # The new engine's prompt held the first part; its completion did not.
            if isinstance(usage.get("prompt_tokens"), int):
                usage["prompt_tokens"] = max(0, usage["prompt_tokens"] - self._tokens)
            if isinstance(usage.get("completion_tokens"), int):
                usage["completion_tokens"] += self._tokens
        return b"data: " + orjson.dumps(chunk) + b"\n\n"


@dataclass(frozen=True, slots=True)
class Form:
    """A dialect's continuation form: how its stream is read (``partial``), its request
    sent again with the answer so far (``body``: None when its output bound is spent),
    and the new engine's events made part of the first answer (``reframe``)."""

    partial: Callable[[], Partial]
    body: Callable[[bytes, Partial], bytes | None]
    reframe: Callable[[Partial], Reframing]


#: Chat Completions' form: ``continue_final_message``.
CHAT = Form(Partial, lambda body, part: continued_body(body, part.text, part.tokens), Reframe)


#: Moves the answer to the next engine with this body: the new response and the
#: engine's label, or why no engine can take it (the forward step's).
Move = Callable[[bytes], Awaitable[tuple[aiohttp.ClientResponse, str] | str]]


class Continuation:
    """One continuable answer: what was sent, and how to go on elsewhere."""

    def __init__(
        self,
        body: bytes,
        attempts: int,
        move: Move,
        so_far: SoFar,
        metrics: Metrics,
        facts: RequestFacts,
        form: Form = CHAT,
    ) -> None:
        self.form = form
        self.body = body
        self.left = attempts
        self.move = move
        self.so_far = so_far
        self.metrics = metrics
        self.facts = facts
        self.reframe: Reframing | None = None

    async def resume(self, exc: BaseException) -> tuple[aiohttp.ClientResponse, bytes] | None:
        """The next engine's stream of the rest of the answer, and the SSE comment that
        says so; None when it cannot go on (the relay then ends it as before)."""
        reason = reason_of(exc)
        part = self.so_far.read()
        why = part.refused
        if why is None and self.left < 1:
            why = "no attempts left (TRIMPROXY_CONTINUE_ATTEMPTS)"
        if why is None and part.finished:
            why = "the answer had ended"
        body = None if why is not None else self.form.body(self.body, part)
        if why is None and body is None:
            why = "max_tokens spent"
        moved = why if body is None else await self.move(body)
        if isinstance(moved, str) or moved is None:
            log.warning("stream broke off (%s); not continued: %s", reason, moved)
            return None
        self.left -= 1
        response, label = moved
        self.reframe = self.form.reframe(part)
        self.metrics.answers_continued.labels(reason).inc()
        step = f"{reason}@{label}"
        before = self.facts.continued
        self.facts.continued = step if before is None else f"{before},{step}"
        log.info("stream broke off (%s) at %d tokens; on %s", reason, part.tokens, label)
        comment = f": trimproxy continued after {reason} on {label} at {part.tokens} tokens\n\n"
        return response, comment.encode()
