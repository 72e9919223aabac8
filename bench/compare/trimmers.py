"""The trimmers under comparison, behind one call shape.

Each trimmer takes OpenAI-style message dicts and a budget and returns the dicts to
forward, or None when it refuses (only trimproxy does: ``context_length_exceeded``).
That is the proxy's situation: dicts in from the client, dicts out to the upstream,
so conversions a peer needs (LangChain's message objects) are part of its cost.

Counting is aligned as far as each peer allows:

* trimproxy counts with the shared counter (it takes any ``TokenCounter``).
* LangChain takes ``token_counter=`` (a callable over its messages); it gets the
  shared counter, reached through ``convert_to_openai_messages``, so it counts
  exactly what the checks count.
* LiteLLM's ``trim_messages`` takes no counter, only ``model=``/``max_tokens=``, and
  counts with ``litellm.token_counter``: for an unknown model that is cl100k_base
  with the OpenAI framing, i.e. the shared counter's tokenizer, minus the tool
  calls' function names. ``litellm`` runs it as shipped. ``litellm/shared`` swaps
  ``litellm.utils.token_counter`` for the shared counter during the call, to tell its
  algorithm's violations apart from counting differences (a patch of LiteLLM's
  internals, labelled as such in the results).

The peers are imported lazily, so the rest of the bench (and its tests) runs in the
proxy's own venv without them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from bench.compare.counting import SharedCounter
from proxy.errors import ContextLengthExceeded
from proxy.tokens.counter import TokenCounter
from proxy.trimming import TrimPolicy, trim

Message = dict[str, Any]


class Trimmer(Protocol):
    name: str
    note: str
    last_error: str | None
    """An error the trimmer caught and hid during the last call (LiteLLM does)."""

    def fresh(self) -> None:
        """Drop every cache this trimmer's counting keeps (a cold start)."""

    async def __call__(self, messages: Sequence[Message], budget: int) -> list[Message] | None: ...


class Trimproxy:
    """trimproxy's request path minus I/O: count with the counter, then ``trim``.

    ``counter`` is any ``TokenCounter``; ``fresh`` makes an empty one (cold calls)."""

    def __init__(
        self,
        counter: TokenCounter,
        target: float = 0.6,
        *,
        fresh: Callable[[], TokenCounter] | None = None,
        name: str = "trimproxy",
    ) -> None:
        self.counter = counter
        self.target = target
        self._fresh = fresh
        self.name = name
        self.last_error: str | None = None
        self.note = f"count + trim(), TRIM_TARGET {target}, counter {counter.name}"

    def fresh(self) -> None:
        if self._fresh is not None:
            self.counter = self._fresh()

    async def __call__(self, messages: Sequence[Message], budget: int) -> list[Message] | None:
        count = await self.counter.count(messages)
        try:
            result = trim(messages, count, TrimPolicy(budget=budget, target=self.target))
        except ContextLengthExceeded:
            return None
        return [messages[i] for i in result.kept]


def shared_trimproxy(counter: SharedCounter, target: float = 0.6) -> Trimproxy:
    return Trimproxy(counter.fresh(), target, fresh=counter.fresh)


def proxy_counter_trimproxy(target: float = 0.6) -> Trimproxy | None:
    """trimproxy with the proxy's own ``tiktoken:cl100k_base`` counter, when that
    backend exists in this tree: its cost per call is the real request path's.
    Timed only; the checks stay on the shared counter."""
    try:
        from proxy.tokens.tiktoken_counter import TiktokenCounter, load_encoding
    except ImportError:
        return None
    enc = load_encoding("cl100k_base")

    def make() -> TokenCounter:
        counter: TokenCounter = TiktokenCounter(enc)
        return counter

    return Trimproxy(make(), target, fresh=make, name="trimproxy/proxy-counter")


def _import_litellm() -> Any:
    # LiteLLM fetches its model price map over the network at import unless told
    # not to; the bench must run offline and not wait on a timeout.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_TELEMETRY", "False")
    import litellm
    import litellm.utils

    return litellm


class _Caught(logging.Handler):
    """Collects the exceptions LiteLLM's trim_messages catches and logs: it then
    returns the input unchanged, which the checks see as a passthrough, and this
    says why. Replaces LiteLLM's own handler so tracebacks do not flood the run."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        self.last = f"{type(exc).__name__}: {exc}" if exc else record.getMessage()


_CAUGHT = _Caught()


class LiteLLM:
    def __init__(self, counter: SharedCounter, *, shared: bool = False) -> None:
        litellm = _import_litellm()
        from importlib.metadata import version

        self._caught = _CAUGHT
        log = logging.getLogger("LiteLLM")
        log.handlers = [_CAUGHT]
        log.propagate = False
        self.last_error: str | None = None
        self._utils = litellm.utils
        self._native = litellm.utils.token_counter
        self.counter = counter
        self.shared = shared
        self.name = "litellm/shared" if shared else "litellm"
        v = version("litellm")
        self.note = f"litellm {v} utils.trim_messages(max_tokens=budget), " + (
            "token_counter patched to the shared counter" if shared else "its own cl100k counting"
        )

    def fresh(self) -> None:
        self.counter = self.counter.fresh()

    def _count(self, model: str | None = None, messages: Sequence[Message] = (), **_: Any) -> int:
        return self.counter.prompt_tokens(messages)

    async def __call__(self, messages: Sequence[Message], budget: int) -> list[Message] | None:
        self._caught.last = None
        if self.shared:
            self._utils.token_counter = self._count
        try:
            return list(self._utils.trim_messages(list(messages), max_tokens=budget))
        finally:
            self._utils.token_counter = self._native
            self.last_error = self._caught.last


class LangChain:
    def __init__(
        self, counter: SharedCounter, *, start_on: str | None = None, cached: bool = True
    ) -> None:
        from importlib.metadata import version

        from langchain_core.messages import convert_to_openai_messages, trim_messages

        self._trim = trim_messages
        self._to_openai = convert_to_openai_messages
        self.counter = counter
        self.start_on = start_on
        self.cached = cached
        self.name = "langchain" + (f"/start_on={start_on}" if start_on else "")
        if not cached:
            self.name += "/uncached"
        self.last_error: str | None = None
        self.note = (
            f"langchain-core {version('langchain-core')} trim_messages(strategy='last', "
            f"include_system=True{f', start_on={start_on!r}' if start_on else ''}), "
            f"token_counter = shared counter"
            + ("" if cached else " without its cache (tokenizes on every call)")
        )

    def fresh(self) -> None:
        self.counter = self.counter.fresh()

    def _count(self, messages: list[Any]) -> int:
        if not self.cached:
            return self.counter.prompt_tokens_uncached(self._to_openai(messages))
        return self.counter.prompt_tokens(self._to_openai(messages))

    async def __call__(self, messages: Sequence[Message], budget: int) -> list[Message] | None:
        out = self._trim(
            list(messages),
            max_tokens=budget,
            token_counter=self._count,
            strategy="last",
            include_system=True,
            start_on=self.start_on,
        )
        converted: list[Message] = self._to_openai(out)
        return converted


PEERS = ("litellm", "litellm/shared", "langchain", "langchain/start_on=human")
#: Swept and timed, but no configuration a user runs: it patches LiteLLM's internals.
DIAGNOSTIC = ("litellm/shared",)
#: Timed only, not swept: the same algorithm as ``langchain`` with the counter most
#: LangChain users write (no cache), to show where LangChain's time goes; and
#: trimproxy with the proxy's own tiktoken counter, when the tree has it.
TIMING_ONLY = ("langchain/uncached", "trimproxy/proxy-counter")


def build(name: str, counter: SharedCounter, target: float = 0.6) -> Trimmer:
    if name == "trimproxy":
        return shared_trimproxy(counter, target)
    if name == "trimproxy/proxy-counter":
        t = proxy_counter_trimproxy(target)
        if t is None:
            raise ValueError("this tree has no proxy.tokens.tiktoken_counter")
        return t
    if name in ("litellm", "litellm/shared"):
        return LiteLLM(counter.fresh(), shared=name.endswith("shared"))
    if name == "langchain":
        return LangChain(counter.fresh())
    if name == "langchain/start_on=human":
        return LangChain(counter.fresh(), start_on="human")
    if name == "langchain/uncached":
        return LangChain(counter.fresh(), cached=False)
    raise ValueError(f"unknown trimmer {name!r}")
