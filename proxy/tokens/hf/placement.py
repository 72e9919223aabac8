"""How one chat template's requests are rendered and split among their messages.

Every implementation of ``Placement`` renders the text vLLM renders (the total is
always counted from it); they differ in how they learn which message each piece of
the text belongs to:

- ``Placed``: Jinja's plain render, each message then found in the text by its
  role's header (``locate.Locator``); a request it cannot place is rendered tracked.
- ``Tracked``: the tracked render (``render.TrackedTemplate``), which notes where the
  template first reads each message.
- ``Estimated``: transformers' own render, the total split in proportion to each
  message's estimate: for a template whose tracked render failed the start-up check.

``HFCounter.self_check`` picks one per template, without tools and with
(``Template.choose``), when the counter is built; a request only calls it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from proxy.tokens.approx import estimate_message
from proxy.tokens.hf.locate import Locator
from proxy.tokens.hf.normalize import ContentFormat, supports_developer
from proxy.tokens.hf.render import Rendered, TrackedTemplate, attribute
from proxy.tokens.shares import scale_to
from proxy.types import JSONObject, Message

#: Messages as transformers hands them to the template (``HFCounter._prepare``).
Prepared = list[dict[str, Any]]
Tools = Sequence[JSONObject] | None
#: ``RunCounter.spans``: (start offset, tokens) of each piece of the text, in order.
Pieces = list[tuple[int, int]]


class Placement(Protocol):
    """Renders a request once, and splits the tokens of its text among its messages."""

    #: "placed", "tracked" or "estimated": what the start-up check chose.
    name: str

    def render(self, prepared: Prepared, tools: Tools) -> Rendered:
        """The text vLLM renders, with each message's bounds in it where known."""
        ...

    def split(
        self, pieces: Pieces, rendered: Rendered, messages: Sequence[Message]
    ) -> tuple[list[int], int]:
        """(tokens of each message, tokens of no message); they sum to the pieces'."""
        ...


class Tracked:
    name = "tracked"

    def __init__(self, tracked: TrackedTemplate) -> None:
        self._tracked = tracked

    def render(self, prepared: Prepared, tools: Tools) -> Rendered:
        return self._tracked.render(prepared, tools)

    def split(
        self, pieces: Pieces, rendered: Rendered, messages: Sequence[Message]
    ) -> tuple[list[int], int]:
        return attribute(pieces, rendered.bounds)


class Placed(Tracked):
    """Placed by ``locator``; rendered tracked where it cannot place a request, or
    once it is refuted (``Locator.note`` turns it off at run time)."""

    name = "placed"

    def __init__(self, tracked: TrackedTemplate, locator: Locator) -> None:
        super().__init__(tracked)
        self._locator = locator

    def render(self, prepared: Prepared, tools: Tools) -> Rendered:
        locator = self._locator
        headers = locator.headers_of(prepared) if locator.usable else None
        if headers is not None:
            text, end = self._tracked.render_plain(prepared, tools)
            bounds = locator.locate(text, prepared, headers, end)
            locator.note(bounds is not None)
            if bounds is not None:
                return Rendered(text, bounds)
        return self._tracked.render(prepared, tools)


class Estimated:
    """``apply_chat_template``'s text, no bounds: the split is by estimate."""

    name = "estimated"

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer

    def render(self, prepared: Prepared, tools: Tools) -> Rendered:
        text = self._tok.apply_chat_template(
            prepared, tools=tools, add_generation_prompt=True, tokenize=False
        )
        return Rendered(text, ())

    def split(
        self, pieces: Pieces, rendered: Rendered, messages: Sequence[Message]
    ) -> tuple[list[int], int]:
        total = sum(n for _, n in pieces)
        return scale_to([estimate_message(m) for m in messages], total), 0


class Template:
    """One chat template of the tokenizer: its renderer, the content format vLLM
    gives it, a locator for its renders without tools and with, and the placement
    chosen for each (tracked until the start-up check chooses)."""

    def __init__(self, source: str, tracked: TrackedTemplate, fmt: ContentFormat) -> None:
        self.source = source
        self.tracked = tracked
        self.format: ContentFormat = fmt
        #: Whether developer messages reach it as they are (else as system ones).
        self.developer = supports_developer(source)
        self.locators = (Locator(), Locator())
        self.placements: tuple[Placement, Placement] = (Tracked(tracked), Tracked(tracked))

    def placement(self, tools: Tools) -> Placement:
        return self.placements[tools is not None]

    def choose(self, tracking_ok: bool, estimated: Estimated) -> None:
        """After the check: placed where a locator was verified, else tracked; by
        estimate where the tracked render failed."""
        if not tracking_ok:
            self.placements = (estimated, estimated)
            return
        first, second = (
            Placed(self.tracked, locator) if locator.usable else Tracked(self.tracked)
            for locator in self.locators
        )
        self.placements = (first, second)
