"""The admit step of the chat route: reserve, or answer 429; and the capacity's source.

``KvAdmission`` wraps a ledger with what the route needs: the timeout, the metrics,
the error a person can act on, what a request's ``Need`` costs on this engine (its
block size, whether its answers share the prompt), and the capacity — fixed from the
setting, or (``auto``) taken from each scrape of the upstream's ``/metrics``
(``observe_engine``). It knows nothing of which engine it stands for: one gate per
engine, each fed that engine's scrapes.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Literal

from proxy.admission.capacity import Capacity, EngineCache, scaled
from proxy.admission.ledger import AdmissionTimeout, Ledger, LedgerUnavailable, Reservation
from proxy.admission.need import Need
from proxy.choices import Endpoint
from proxy.errors import ClientClosedRequest, Overloaded, SessionStoreUnavailable
from proxy.hop import CancelOnDisconnect
from proxy.metrics import ENDPOINTS, Metrics

log = logging.getLogger("trimproxy.admission")

WAIT_HEADER = "x-trimproxy-admission-wait-ms"

_SETTINGS = "TRIMPROXY_KV_ADMISSION, TRIMPROXY_KV_ADMISSION_FRACTION, TRIMPROXY_ADMISSION_TIMEOUT"


class KvAdmission:
    def __init__(
        self,
        ledger: Ledger,
        metrics: Metrics,
        *,
        mode: Literal["auto", "fixed"],
        fraction: float,
        timeout: float,
        fixed_tokens: int | None = None,
        engine: str | None = None,
    ) -> None:
        self.ledger = ledger
        # Several engines: each gate adds its share to the unlabelled totals and sets
        # its own ``engine`` series (docs/engines.md).
        self._capacity_shown = 0
        self._engine_capacity = (
            None if engine is None else metrics.engine_kv_capacity.labels(engine)
        )
        self._engine_reserved = (
            None if engine is None else metrics.engine_kv_reserved.labels(engine)
        )
        self.metrics = metrics
        self.mode = mode
        self.fraction = fraction
        self.timeout = timeout
        # Until the engine says otherwise (vLLM's cache_config_info), the n answers of a
        # request are counted each with its own prompt: a transformers worker holds them so.
        self.shares_prompt = False
        self._said_missing = False
        # Every (reason, endpoint) child bound up front: each series reads 0 from the
        # start (a rate over it is defined), and a refusal looks up no labels.
        self._rejected = {
            endpoint: {
                reason: metrics.admission_rejected.labels(reason, endpoint)
                for reason in ("timeout", "store_unavailable", "client_closed")
            }
            for endpoint in ENDPOINTS
        }
        if fixed_tokens is not None:
            self._set(scaled(fixed_tokens, fraction))

    @property
    def capacity(self) -> Capacity | None:
        return self.ledger.capacity

    def observe_engine(self, cache: EngineCache | None) -> None:
        """A scrape's figures; None when the upstream published none. ``auto`` takes the
        capacity from them; either mode learns whether the answers share the prompt."""
        if cache is not None:
            self.shares_prompt = cache.shares_prompt
        if self.mode != "auto":
            return
        if cache is None:
            if self.ledger.capacity is None and not self._said_missing:
                self._said_missing = True
                log.warning(
                    "TRIMPROXY_KV_ADMISSION=auto, but the upstream's /metrics has no "
                    "vllm:cache_config_info (FastChat publishes none): admission stays off "
                    "until it does; set TRIMPROXY_KV_ADMISSION to a number of tokens instead"
                )
            return  # keep the last capacity seen: a failed scrape changes no engine
        capacity = scaled(cache.tokens, self.fraction, cache.block_size)
        if capacity != self.ledger.capacity:
            log.info(
                "KV admission: %d tokens (engine %d tokens in blocks of %d, fraction %g)",
                capacity.tokens,
                cache.tokens,
                cache.block_size,
                self.fraction,
            )
            self._set(capacity)

    def _set(self, capacity: Capacity) -> None:
        self.ledger.set_capacity(capacity)
        if self._engine_capacity is None:
            self.metrics.kv_capacity.set(capacity.tokens)
        else:  # one of several engines' gates: its share of the total
            self.metrics.kv_capacity.inc(capacity.tokens - self._capacity_shown)
            self._capacity_shown = capacity.tokens
            self._engine_capacity.set(capacity.tokens)

    def tokens(self, need: Need | int) -> int:
        """What ``need`` costs on this engine: whole blocks, the prompt shared or not
        (``Need.tokens``); a plain number of tokens is taken as it is."""
        if isinstance(need, int):
            return need
        capacity = self.ledger.capacity
        return need.tokens(capacity.block_size if capacity else 1, self.shares_prompt)

    async def admit(self, need: Need | int, endpoint: Endpoint = "chat") -> Reservation:
        """Reserve what ``need`` can hold (``tokens``); 429 after the timeout. A refusal
        is counted on ``endpoint``, the API the request came in by.

        The caller releases the reservation when the answer ends however it ends; a
        cancelled wait (the client left) leaves the line on its own.
        """
        tokens = self.tokens(need)
        rejected = self._rejected[endpoint]
        try:
            reservation = await self.ledger.reserve(tokens, self.timeout)
        except AdmissionTimeout as exc:
            rejected["timeout"].inc()
            self.metrics.admission_wait.observe(self.timeout)
            raise self._overloaded(tokens, exc) from None
        except LedgerUnavailable as exc:
            rejected["store_unavailable"].inc()
            raise SessionStoreUnavailable(
                f"The KV admission ledger ({exc.target}) is unavailable, and this proxy "
                "refuses requests it cannot admit (TRIMPROXY_SESSION_STORE_FAILURE=closed). "
                "Retry in a few seconds.",
                headers={"retry-after": "1"},
            ) from None
        except BaseException:
            rejected["client_closed"].inc()
            raise
        self.metrics.admission_wait.observe(reservation.waited)
        if reservation.charge:
            gauge = self.metrics.kv_reserved
            gauge.inc(reservation.charge)
            own = self._engine_reserved
            if own is not None:
                own.inc(reservation.charge)

            def give_back(held: Reservation) -> None:  # grown or not
                gauge.dec(held.charge)
                if own is not None:
                    own.dec(held.charge)

            reservation.then(give_back)
        return reservation

    def grow(self, reservation: Reservation, tokens: int) -> None:
        """Add ``tokens`` to a reservation whose answer outgrew it (``overrun``)."""
        added = reservation.grow(tokens)
        if added:
            self.metrics.kv_reserved.inc(added)
            if self._engine_reserved is not None:
                self._engine_reserved.inc(added)

    async def admit_while_connected(
        self, need: Need | int, client_gone: asyncio.Future[None], endpoint: Endpoint = "chat"
    ) -> Reservation:
        """``admit``, given up (499, nothing held) when the client leaves while waiting."""
        with CancelOnDisconnect(client_gone) as watch:
            return await self.admit(need, endpoint)
        assert watch.fired  # only a disconnect ends the block without a return
        raise ClientClosedRequest("The client closed the connection while waiting for KV room.")

    def _overloaded(self, tokens: int, exc: AdmissionTimeout) -> Overloaded:
        capacity = self.ledger.capacity
        total = capacity.tokens if capacity else 0
        retry = max(1, min(60, math.ceil(self.timeout)))
        return Overloaded(
            f"The engine's KV cache had no room for this request's {tokens} tokens within "
            f"{self.timeout:g} s: {exc.reserved} of {total} tokens are reserved by answers in "
            f"progress, and {exc.waiting} request(s) wait in line. Retry after {retry} s. "
            f"Operators: see {_SETTINGS}.",
            headers={"retry-after": str(retry)},
        )

    async def aclose(self) -> None:
        await self.ledger.aclose()


def wait_header(reservation: Reservation) -> dict[str, str]:
    """``X-Trimproxy-Admission-Wait-Ms`` for an answer that waited in line."""
    if reservation.waited <= 0:
        return {}
    return {WAIT_HEADER: str(max(1, round(reservation.waited * 1000)))}
