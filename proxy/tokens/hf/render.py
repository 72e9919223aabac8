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

# (message index, pass: 0 for reads by index, else the iteration pass, output offset)
# of the first read of a message by index, and of its first read in each pass.
Touch = tuple[int, int, int]


class _Tracker:
    __slots__ = ("offset", "passes", "touches")

    def __init__(self) -> None:
        self.offset = 0
        self.passes = 0
        self.touches: list[Touch] = []


class _Seen(dict[str, Any]):
    """A message whose first read (in this pass) has been noted: a plain dict to the
    template. A ``_Msg`` turns into one on its first read (same layout, so its class
    can be swapped), and every later read is the dict's own, with no Python call:
    templates read each message several times, ~160 reads a 20-message render."""

    __slots__ = ("_idx", "_pass", "_tracker")

    def __init__(self, raw: dict[str, Any], idx: int, pass_id: int, tracker: _Tracker) -> None:
        super().__init__(raw)
        self._idx = idx
        self._pass = pass_id
        self._tracker = tracker


class _Msg(_Seen):
    """A message that notes the first read of it (per iteration pass). Writes are
    refused by the sandbox, as for a plain dict."""

    __slots__ = ()

    # The reads below call dict's methods by name: once the class is swapped, self is
    # no _Msg, and super() would refuse it.
    def _touch(self) -> None:
        self.__class__ = _Seen  # type: ignore[assignment]  # only the first read matters
        tracker = self._tracker
        tracker.touches.append((self._idx, self._pass, tracker.offset))

    def __getitem__(self, key: str) -> Any:
        self._touch()
        return dict.__getitem__(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        self._touch()
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


class _Msgs(list[_Seen]):
    """The message list: each iteration is a numbered pass, slices stay tracked.

    Iteration yields a second proxy per message (made once per render), relabelled
    with the pass that yielded it, so loop reads and index reads stay apart.
    """

    __slots__ = ("_loop", "_tracker")

    def __init__(self, items: Sequence[_Seen], loop: Sequence[_Seen], tracker: _Tracker) -> None:
        super().__init__(items)
        self._loop = loop
        self._tracker = tracker

    def __iter__(self) -> Iterator[_Seen]:
        tracker = self._tracker
        tracker.passes += 1
        pass_id = tracker.passes
        for msg in super().__iter__():
            proxy = self._loop[msg._idx]
            proxy._pass = pass_id
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


def _bounds(n: int, touches: list[Touch], end: int) -> list[int]:
    first_any: dict[int, int] = {}
    by_pass: dict[int, dict[int, int]] = {}
    for idx, pass_id, offset in touches:
        first_any.setdefault(idx, offset)
        if pass_id > 0:
            by_pass.setdefault(pass_id, {}).setdefault(idx, offset)
    main: dict[int, int] = {}
    if by_pass:
        # The main loop is the pass that spans the most output (then: the most messages).
        main = max(
            by_pass.values(),
            key=lambda firsts: (max(firsts.values()) - min(firsts.values()), len(firsts)),
        )
    bounds: list[int] = []
    prev = 0
    for i in range(n):
        at = main.get(i, first_any.get(i, prev))
        prev = max(prev, min(at, end))
        bounds.append(prev)
    bounds.append(max(prev, end))
    # Leading messages that the main loop writes nothing for (a system message the
    # template rendered before the loop) start where the template first read them.
    for i in range(n):
        if bounds[i + 1] != bounds[i]:
            break
        lo = bounds[i - 1] if i else 0
        bounds[i] = max(lo, min(first_any.get(i, bounds[i]), bounds[i]))
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
        messages = _Msgs(
            [_Msg(m, i, 0, tracker) for i, m in enumerate(conversation)],
            [_Msg(m, i, -1, tracker) for i, m in enumerate(conversation)],
            tracker,
        )
        chunks: list[str] = []
        append = chunks.append
        for chunk in self._compiled.generate(
            **self._context,
            messages=messages,
            tools=list(tools) if tools is not None else None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
        ):
            append(chunk)
            tracker.offset += len(chunk)
        text = "".join(chunks)
        end = len(text)
        suffix = self.generation_suffix
        if add_generation_prompt and suffix and text.endswith(suffix):
            end -= len(suffix)
        return Rendered(text, tuple(_bounds(len(conversation), tracker.touches, end)))

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
    parts is always the whole.
    """
    n = len(bounds) - 1
    per = [0] * n
    overhead = 0
    first, end = (bounds[0], bounds[-1]) if n else (0, 0)
    for start, tokens in pieces:
        if n == 0 or start < first or start >= end:
            overhead += tokens
        else:
            per[bisect_right(bounds, start, 0, n) - 1] += tokens
    return per, overhead
