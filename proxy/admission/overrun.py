"""Answers that may run past their reservation: grown while they stream, counted at the end.

Only a request whose allowance is the default reserve (it named no ``max_tokens``, and
``TRIMPROXY_MAX_COMPLETION_TOKENS`` is unset) can overrun: the engine was told no limit.
``AnswerWatch`` follows such an answer.

* **Streamed**, it counts the SSE events as the relay passes them on (``on_chunk``):
  vLLM sends one event per generated token and answer (its ``--stream-interval`` is 1
  by default). A chat stream has one opening event per answer and ``[DONE]`` besides
  (each ``data:`` counts, no parsing); a Responses stream one ``response.*.delta``
  event per token (text, reasoning, call arguments) and a Messages stream one
  ``content_block_delta``, among events that carry none (the ``AnswerShape`` names the
  event to count). A ``bytes.count`` per chunk; a marker split across two chunks is
  counted once. Once the events reach what the reservation covers, the reservation
  grows by ``GROWTH_STEP`` tokens at a time, ahead of the answer, so the ledger keeps
  counting what the engine holds and new requests wait instead of the engine
  preempting. (A server that puts several tokens in one event, as FastChat does with
  its ``stream_interval`` of 2, is undercounted by that factor.) At its end, a
  Responses or Messages stream's own usage (``response.completed``,
  ``message_delta``) says what it held, where the last events carry it.
* **Not streamed**, nothing can be seen until the end: the answer's usage
  (``completion_tokens``, ``output_tokens``) says whether it overran.

Either way an answer that held more than its reservation counts once in
``trimproxy_admission_overrun_total`` and its excess in
``trimproxy_admission_overrun_tokens_total``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxy.admission.ledger import Reservation
from proxy.admission.need import Need
from proxy.types import JSONObject

if TYPE_CHECKING:
    from proxy.admission.gate import KvAdmission

#: Tokens a reservation grows by at a time, rounded up to whole blocks: one step ahead
#: of the answer, so that a long answer costs one ledger update per step, not per token.
GROWTH_STEP = 128

# The last ``"completion_tokens": N`` of a body: usage comes after the choices. One in
# message text would be escaped (\"completion_tokens\"), hence the look-behind.
_COMPLETION_TOKENS = re.compile(rb'(?<!\\)"completion_tokens"\s*:\s*(\d+)')
_OUTPUT_TOKENS = re.compile(rb'(?<!\\)"output_tokens"\s*:\s*(\d+)')
_TAIL = 4096


@dataclass(frozen=True, slots=True)
class AnswerShape:
    """Where one wire format's answer shows its completion tokens."""

    marker: bytes
    """What each counted SSE event holds (no marker may overlap itself)."""
    usage: re.Pattern[bytes]
    """The completion count in the answer's usage (its last match)."""
    every_event: bool
    """Every event is counted (chat: the ones without a token are known); else only
    the token events are, and the stream's usage is read at its end."""


#: ``data:`` per event; usage ``completion_tokens``.
CHAT_ANSWER = AnswerShape(b"data:", _COMPLETION_TOKENS, every_event=True)
#: ``event: response.output_text.delta`` (and the reasoning and call argument deltas).
RESPONSES_ANSWER = AnswerShape(b".delta\ndata:", _OUTPUT_TOKENS, every_event=False)
#: ``event: content_block_delta``.
MESSAGES_ANSWER = AnswerShape(b"content_block_delta\ndata:", _OUTPUT_TOKENS, every_event=False)


def asks_usage(body: JSONObject) -> bool:
    """The streamed request asked for a usage chunk at the end (``include_usage``)."""
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def completion_tokens(body: bytes, shape: AnswerShape = CHAT_ANSWER) -> int | None:
    """The completion count of an answer's usage (the last in its tail)."""
    found = shape.usage.findall(body[-_TAIL:])
    return int(found[-1]) if found else None


class AnswerWatch:
    """One answer that may outgrow its reservation (see the module's docstring)."""

    __slots__ = (
        "_besides",
        "_carry",
        "_covered",
        "_events",
        "_gate",
        "_need",
        "_reservation",
        "_shape",
        "_step",
        "_stream",
        "_tail",
    )

    def __init__(
        self,
        gate: KvAdmission,
        reservation: Reservation,
        need: Need,
        stream: bool,
        usage_event: bool = False,
        shape: AnswerShape = CHAT_ANSWER,
    ) -> None:
        """``usage_event``: the streamed chat request asked for a usage chunk
        (``asks_usage``); ``shape``: the answer's wire format."""
        self._gate = gate
        self._stream = stream
        self._reservation = reservation
        self._need = need
        self._shape = shape
        block = gate.capacity.block_size if gate.capacity else 1
        self._step = -(-GROWTH_STEP // block) * block
        # Counted events that carry no token: each chat answer's opening one, [DONE],
        # the usage chunk; none where only the token events are counted.
        self._besides = max(need.n, 1) + 1 + usage_event if shape.every_event else 0
        # Past this many events, each one is a token the engine holds beyond the reservation.
        self._covered = need.completion + self._besides
        self._events = 0
        # The end of the last chunk, where a marker may have begun; the stream's last
        # bytes, where a dialect's usage stands.
        self._carry = b""
        self._tail = b""

    def on_chunk(self, chunk: bytes) -> None:
        """A chunk of the streamed answer, as the relay sends it on."""
        marker = self._shape.marker
        keep = len(marker) - 1
        if self._carry:
            # A marker cut by a chunk boundary: the carry is too short to hold a whole
            # one, so each one found across it is new.
            self._events += (self._carry + chunk[:keep]).count(marker)
        self._events += chunk.count(marker)
        carry = self._carry + chunk if len(chunk) < keep else chunk
        self._carry = carry[-keep:]
        if not self._shape.every_event:
            self._tail = (self._tail + chunk)[-_TAIL:]
        if self._events > self._covered:
            over = self._events - self._covered
            grow = -(-over // self._step) * self._step
            self._covered += grow
            self._gate.grow(self._reservation, grow)

    def finish(self, captured: bytes | None) -> None:
        """The answer ended, whole or not; ``captured``: a non-streamed one's body, None
        when it broke off (nothing to tell then)."""
        if self._stream:
            found = None if self._shape.every_event else completion_tokens(self._tail, self._shape)
            tokens = self._events - self._besides if found is None else found
        else:
            found = None if captured is None else completion_tokens(captured, self._shape)
            if found is None:
                return
            tokens = found
        over = tokens - self._need.completion
        if over > 0:
            metrics = self._gate.metrics
            metrics.admission_overrun.inc()
            metrics.admission_overrun_tokens.inc(over)
