"""Answers that may run past their reservation: grown while they stream, counted at the end.

Only a request whose allowance is the default reserve (it named no ``max_tokens``, and
``TRIMPROXY_MAX_COMPLETION_TOKENS`` is unset) can overrun: the engine was told no limit.
``AnswerWatch`` follows such an answer.

* **Streamed**, it counts the SSE events as the relay passes them on (``on_chunk``):
  vLLM sends one event per generated token and answer (its ``--stream-interval`` is 1
  by default), plus one opening event per answer and ``[DONE]``. A ``bytes.count`` per
  chunk, no parsing. Once the events reach what the reservation covers, the reservation
  grows by ``GROWTH_STEP`` tokens at a time, ahead of the answer, so the ledger keeps
  counting what the engine holds and new requests wait instead of the engine
  preempting. (A server that puts several tokens in one event, as FastChat does with
  its ``stream_interval`` of 2, is undercounted by that factor.)
* **Not streamed**, nothing can be seen until the end: the answer's
  ``usage.completion_tokens`` says whether it overran.

Either way an answer that held more than its reservation counts once in
``trimproxy_admission_overrun_total`` and its excess in
``trimproxy_admission_overrun_tokens_total``.
"""

from __future__ import annotations

import re
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
_TAIL = 4096


def asks_usage(body: JSONObject) -> bool:
    """The streamed request asked for a usage chunk at the end (``include_usage``)."""
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def completion_tokens(body: bytes) -> int | None:
    """``usage.completion_tokens`` of a non-streamed answer (the last in its tail)."""
    found = _COMPLETION_TOKENS.findall(body[-_TAIL:])
    return int(found[-1]) if found else None


class AnswerWatch:
    """One answer that may outgrow its reservation (see the module's docstring)."""

    __slots__ = (
        "_besides",
        "_covered",
        "_events",
        "_gate",
        "_need",
        "_reservation",
        "_step",
        "_stream",
    )

    def __init__(
        self,
        gate: KvAdmission,
        reservation: Reservation,
        need: Need,
        stream: bool,
        usage_event: bool = False,
    ) -> None:
        """``usage_event``: the streamed request asked for a usage chunk (``asks_usage``)."""
        self._gate = gate
        self._stream = stream
        self._reservation = reservation
        self._need = need
        block = gate.capacity.block_size if gate.capacity else 1
        self._step = -(-GROWTH_STEP // block) * block
        # Events that carry no token: each answer's opening one, [DONE], the usage chunk.
        self._besides = max(need.n, 1) + 1 + usage_event
        # Past this many events, each one is a token the engine holds beyond the reservation.
        self._covered = need.completion + self._besides
        self._events = 0

    def on_chunk(self, chunk: bytes) -> None:
        """A chunk of the streamed answer, as the relay sends it on."""
        self._events += chunk.count(b"data:")
        if self._events > self._covered:
            over = self._events - self._covered
            grow = -(-over // self._step) * self._step
            self._covered += grow
            self._gate.grow(self._reservation, grow)

    def finish(self, captured: bytes | None) -> None:
        """The answer ended, whole or not; ``captured``: a non-streamed one's body, None
        when it broke off (nothing to tell then)."""
        if self._stream:
            tokens = self._events - self._besides
        else:
            found = None if captured is None else completion_tokens(captured)
            if found is None:
                return
            tokens = found
        over = tokens - self._need.completion
        if over > 0:
            metrics = self._gate.metrics
            metrics.admission_overrun.inc()
            metrics.admission_overrun_tokens.inc(over)
