"""Render a chat template once and learn where each message's text lies in it.

The conversation is rendered with transformers' own compiled template (the same
sandboxed environment, filters and globals as ``apply_chat_template``), but the
messages are handed to it as thin dict/list subclasses that note the output offset
at which the template first reads each message. The template's main ``for message in
messages`` loop reads message *i* just before it writes message *i*'s text, so the
first read of each message in that loop marks where the message begins. Reads by
index (``messages[0]``, ``messages[i + 1]``) and by look-ahead (``loop.last``) do
not count as the loop's; pre-scans (a loop that collects system messages) are told
apart from the main loop by how much output they span.

Everything before the first message (BOS, a default system prompt, the tool
schemas) and the generation prompt after the last belong to no message.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, SupportsIndex, overload

import jinja2

#: First reads of one pass: message index -> the output offset at its first read.
#: Filled in the order of the reads, so its offsets never decrease along it.
FirstReads = dict[int, int]


class _Tracker:
    __slots__ = ("offset", "passes")

    def __init__(self) -> None:
        self.offset = 0
        #: ``passes[0]``: the first read of each message by index; ``passes[p]``: its
        #: first read in iteration pass p.
        self.passes: list[FirstReads] = [{}]


class _Seen(dict[str, Any]):
    """A message whose first read (in this pass) has been noted: a plain dict to the
    template. A ``_Msg`` turns into one on its first read (same layout, so its class
    can be swapped), and every later read is the dict's own, with no Python call:
    templates read each message several times, ~160 reads a 20-message render.

    Built by ``_proxies``: dict's own constructor, then the slots (a Python
    ``__init__`` calling ``super()`` costs more than the copy, 40 times a render).
    ``_firsts`` is the first-read map of the pass the proxy belongs to.
    """

    __slots__ = ("_firsts", "_idx", "_tracker")
    _firsts: FirstReads
    _idx: int
    _tracker: _Tracker


class _Msg(_Seen):
    """A message that notes the first read of it (per iteration pass). Writes are
    refused by the sandbox, as for a plain dict."""

    __slots__ = ()

    # The reads below call dict's methods by name: once the class is swapped, self is
    # no _Msg, and super() would refuse it. The two reads templates use most note the
    # read themselves, without a call to _touch.
    def _touch(self) -> None:
        self.__class__ = _Seen  # type: ignore[assignment]  # only the first read matters
        self._firsts.setdefault(self._idx, self._tracker.offset)

    def __getitem__(self, key: str) -> Any:
        self.__class__ = _Seen  # type: ignore[assignment]
        self._firsts.setdefault(self._idx, self._tracker.offset)
        return dict.__getitem__(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        self.__class__ = _Seen  # type: ignore[assignment]
        self._firsts.setdefault(self._idx, self._tracker.offset)
        return dict.get(self, key, default)

    def __contains__(self, key: object) -> bool:
        self._touch()
        return dict.__contains__(self, key)

    def keys(self) -> Any:
        self._touch()
        return dict.keys(self)

    def items(self) -> Any:
        self._touch()
        return dict.items(self)

    def values(self) -> Any:
        self._touch()
        return dict.values(self)


def _proxies(conversation: Sequence[dict[str, Any]], tracker: _Tracker) -> list[_Seen]:
    """A proxy per message, noting its reads by index (``passes[0]``) until an
    iteration pass takes it over."""
    out: list[_Seen] = []
    append = out.append
    by_index = tracker.passes[0]
    for i, message in enumerate(conversation):
        proxy = _Msg(message)
        proxy._idx = i
        proxy._firsts = by_index
        proxy._tracker = tracker
        append(proxy)
    return out


class _Msgs(list[_Seen]):
    """The message list: each iteration is a numbered pass, slices stay tracked.

    Iteration yields a second proxy per message (made once per render), handed the
    first-read map of the pass that yielded it, so loop reads and index reads stay
    apart.
    """

    __slots__ = ("_loop", "_tracker")

    def __init__(self, items: Sequence[_Seen], loop: Sequence[_Seen], tracker: _Tracker) -> None:
        super().__init__(items)
        self._loop = loop
        self._tracker = tracker

    def __iter__(self) -> Iterator[_Seen]:
        firsts: FirstReads = {}
        self._tracker.passes.append(firsts)
        loop = self._loop
        for msg in super().__iter__():
            proxy = loop[msg._idx]
            proxy._firsts = firsts
            proxy.__class__ = _Msg  # fresh again: this pass's first read is noted
            yield proxy

    @overload
    def __getitem__(self, key: SupportsIndex) -> _Seen: ...
    @overload
    def __getitem__(self, key: slice) -> list[_Seen]: ...
    def __getitem__(self, key: SupportsIndex | slice) -> _Seen | list[_Seen]:
        if isinstance(key, slice):
            return _Msgs(super().__getitem__(key), self._loop, self._tracker)
        return super().__getitem__(key)


@dataclass(frozen=True, slots=True)
class Rendered:
    text: str
    #: b_0 .. b_{n-1}, then the end of the last message (start of the generation prompt)
    bounds: tuple[int, ...]


def _bounds(n: int, passes: list[FirstReads], end: int) -> list[int]:
    def first_read(i: int, default: int) -> int:
        # The earliest read of message i, in any pass or by index: offsets only grow,
        # so the lowest one.
        found = [firsts[i] for firsts in passes if i in firsts]
        return min(found) if found else default

    main: FirstReads = {}
    best: tuple[int, int] | None = None
    for firsts in passes[1:]:
        if not firsts:
            continue
        # The main loop is the pass that spans the most output (then: the most messages).
        offsets = list(firsts.values())
        key = (offsets[-1] - offsets[0], len(offsets))
        if best is None or key > best:
            best, main = key, firsts
    bounds: list[int] = []
    append = bounds.append
    prev = 0
    for i in range(n):
        at = main.get(i)
        if at is None:
            at = first_read(i, prev)
        if at > end:
            at = end
        if at > prev:
            prev = at
        append(prev)
    append(max(prev, end))
    # Leading messages that the main loop writes nothing for (a system message the
    # template rendered before the loop) start where the template first read them.
    for i in range(n):
        if bounds[i + 1] != bounds[i]:
            break
        lo = bounds[i - 1] if i else 0
        bounds[i] = max(lo, min(first_read(i, bounds[i]), bounds[i]))
    return bounds


class TrackedTemplate:
    """Renders one chat template with message tracking."""

    def __init__(self, compiled: jinja2.Template, context: dict[str, Any]) -> None:
        self._compiled = compiled
        self._context = context  # special tokens and other fixed template variables
        self.generation_suffix = ""

    def render(
        self,
        conversation: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool = True,
    ) -> Rendered:
        tracker = _Tracker()
        messages = _Msgs(_proxies(conversation, tracker), _proxies(conversation, tracker), tracker)
        chunks: list[str] = []
        append = chunks.append
        for chunk in self._generate(messages, tools, add_generation_prompt):
            append(chunk)
            tracker.offset += len(chunk)
        text = "".join(chunks)
        end = self._end(text, add_generation_prompt)
        return Rendered(text, tuple(_bounds(len(conversation), tracker.passes, end)))

    def render_plain(
        self, conversation: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
    ) -> tuple[str, int]:
        """The same text, rendered untracked, and where the generation prompt begins
        (what ``locate.Locator`` needs to place the messages itself)."""
        text = "".join(self._generate(conversation, tools, True))
        return text, self._end(text, True)

    def _generate(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> Iterator[str]:
        return self._compiled.generate(
            **self._context,
            messages=messages,
            tools=list(tools) if tools is not None else None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
        )

    def _end(self, text: str, add_generation_prompt: bool) -> int:
        """Where the last message ends: before the generation prompt, when it is a
        plain suffix."""
        suffix = self.generation_suffix
        if add_generation_prompt and suffix and text.endswith(suffix):
            return len(text) - len(suffix)
        return len(text)

    def learn_generation_suffix(self, sample_conversation: Sequence[dict[str, Any]]) -> None:
        """The text ``add_generation_prompt`` appends, when it is a plain suffix."""
        self.generation_suffix = ""
        with_prompt = self.render(sample_conversation, None).text
        without = self.render(sample_conversation, None, add_generation_prompt=False).text
        if with_prompt.startswith(without):
            self.generation_suffix = with_prompt[len(without) :]


def attribute(pieces: list[tuple[int, int]], bounds: Sequence[int]) -> tuple[list[int], int]:
    """Sum piece counts per message; pieces outside every message are overhead.

    A piece belongs to the message its first character lies in, so the sum of the
    parts is always the whole. ``pieces`` come in the order of the text (as
    ``RunCounter.spans`` gives them), so the message only moves forward: it is looked
    up again only when a piece starts past the current one's end.
    """
    n = len(bounds) - 1
    per = [0] * max(n, 0)
    if n <= 0:
        return per, sum(tokens for _, tokens in pieces)
    first, end = bounds[0], bounds[-1]
    overhead = 0
    i = -1  # the message of the last piece in one
    following = first  # bounds[i + 1]: where the next message begins
    for start, tokens in pieces:
        if start < first or start >= end:
            overhead += tokens
            continue
        if start >= following:
            i = bisect_right(bounds, start, i + 1, n) - 1
            following = bounds[i + 1]
        per[i] += tokens
    return per, overhead
