"""Where each message lies in a plain rendering of the chat template.

The tracked rendering (``render``) learns each message's place by watching the
template read it, and that costs as much again as rendering (docs/performance.md
§6). Most templates write a message as a header that depends on
its role only, then its text. After a plain render, such a message's place can be
found instead: its role's header, searched for after the previous message's text,
with its own text right after it. An assistant's tool-call turn (``content``
null or empty) has no text to check: it is placed by its header alone, and the calls the
template writes lie between that and the next message's header; this is used only
where it gave the tracked bounds on the check conversation that has one.

The headers are learned at start-up from the tracked renderings of the check
conversations, and a ``Locator`` is used only where it gave the tracked bounds on
every check conversation it could place, and on at least one. A request it cannot
place (content parts or an empty string, a role without one header, text
the template changed) is rendered tracked, as before; a template that changes text
on more than a fifth of its requests (one that strips reasoning from the history)
stops being located, so that it does not render twice for long.
Only the split between messages rests on this: the total is counted from the text.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from proxy.tokens.hf.render import Rendered

log = logging.getLogger("trimproxy.tokens")

#: Requests a locator may fail to place before its share of failures is judged.
_GRACE = 32


class Locator:
    """Places the messages of one template's plain renders (with or without tools)."""

    __slots__ = ("contentless", "headers", "missed", "placed", "refuted", "verified")

    def __init__(self) -> None:
        #: role -> the text between a message's bound and its content; None where two
        #: messages of the role disagreed (position-dependent headers).
        self.headers: dict[str, str | None] = {}
        self.verified = False
        """Placed a check conversation exactly where the tracked rendering did."""
        self.refuted = False
        """Placed one elsewhere, or failed on too many requests: never used again."""
        self.contentless: bool | None = None
        """Whether a message without text (an assistant's ``tool_calls`` turn, its
        ``content`` null, or ``""`` as vLLM's normalisation makes it) is placed by
        its header alone: True once a check conversation with one was placed as
        tracking places it, False once one was not (such requests are then rendered
        tracked; the others are still placed)."""
        self.placed = 0
        self.missed = 0

    @property
    def usable(self) -> bool:
        return self.verified and not self.refuted

    # --- start-up -----------------------------------------------------------------

    def learn(self, conversation: Sequence[dict[str, Any]], rendered: Rendered) -> None:
        """Note each role's header from a tracked rendering: the text from a message's
        bound to where its content begins, where the content lies in its own stretch."""
        text, bounds = rendered.text, rendered.bounds
        for i, message in enumerate(conversation):
            content, role = message.get("content"), message.get("role")
            if content.__class__ is not str or not content or role.__class__ is not str:
                continue
            at, _ = _find(text, content, bounds[i])
            if at < 0 or at >= bounds[i + 1]:
                continue  # the template changed the text: nothing to learn from it
            header = text[bounds[i] : at]
            # An empty header would leave the text alone to say where a message is.
            if not header or self.headers.setdefault(role, header) != header:
                self.headers[role] = None

    def verify(self, conversation: Sequence[dict[str, Any]], rendered: Rendered) -> None:
        """Compare with a tracked rendering: one disagreement and the locator is off."""
        contentless = any(not m.get("content") for m in conversation)
        headers = self.headers_of(conversation, contentless=True)
        if headers is None:
            return
        got = self.locate(rendered.text, conversation, headers, rendered.bounds[-1])
        if got is None:
            return  # the template changed a text: no answer, and no wrong one
        if not contentless:
            self.verified = self.verified or got == rendered.bounds
            self.refuted = self.refuted or got != rendered.bounds
            return
        # Messages without text are the only ones placed by header alone: a template
        # that writes them otherwise turns that off, not the whole locator.
        placed = got == rendered.bounds
        self.contentless = placed and self.contentless is not False
        self.verified = self.verified or placed

    # --- per request ----------------------------------------------------------------

    def headers_of(
        self, conversation: Sequence[dict[str, Any]], *, contentless: bool | None = None
    ) -> list[str] | None:
        """Each message's header, or None when a message's role has no header or its
        content is neither a non-empty string nor empty (null or ``""``: a
        ``tool_calls`` turn, placed by its header alone where that was proven, ``contentless``):
        known before rendering, so such a request is rendered once, tracked."""
        if contentless is None:
            contentless = self.contentless is True
        headers = self.headers
        out: list[str] = []
        append = out.append
        for message in conversation:
            content = message.get("content")
            header = headers.get(message.get("role"))  # type: ignore[arg-type]
            if header is None:
                return None
            if content.__class__ is not str or not content:
                textless = content is None or content == ""
                if not (contentless and textless):
                    return None
            append(header)
        return out

    @staticmethod
    def locate(
        text: str, conversation: Sequence[dict[str, Any]], headers: Sequence[str], end: int
    ) -> tuple[int, ...] | None:
        """The bounds ``render`` would give (each message's start, then ``end``), or
        None when a message is not where its header (``headers_of``) and text say."""
        # The header first: a short search from where the last text ended, then the
        # text compared in place. Searching for the text itself (hundreds of
        # characters) costs str.find's set-up for a long needle on every message.
        bounds: list[int] = []
        append = bounds.append
        pos = 0
        for message, header in zip(conversation, headers, strict=True):
            start = text.find(header, pos)
            if start < 0:
                return None
            pos = start + len(header)
            append(start)
            content = message.get("content")
            if not content:
                # A tool-call turn: what the template writes for its calls lies
                # between its header and the next message's.
                continue
            if not text.startswith(content, pos):
                content = content.strip()  # templates that trim it
                if not content or not text.startswith(content, pos):
                    return None
            pos += len(content)
        if pos > end:
            return None
        append(end)
        return tuple(bounds)

    def note(self, placed: bool) -> None:
        """Count a request's outcome; turn the locator off when more than a fifth of
        them fail, after ``_GRACE`` failures (each one costs a second, tracked,
        rendering)."""
        if placed:
            self.placed += 1
            return
        self.missed += 1
        if self.missed >= _GRACE and self.missed * 4 > self.placed:
            self.refuted = True
            log.warning(
                "chat template: %d of %d requests' messages were not found in the plain "
                "rendering; rendering with tracking from now on",
                self.missed,
                self.missed + self.placed,
            )


def _find(text: str, content: str, pos: int) -> tuple[int, int]:
    """Where ``content`` first appears at or after ``pos``, and its length there;
    stripped of its edge whitespace when not found whole (templates that ``trim``)."""
    at = text.find(content, pos)
    if at >= 0:
        return at, len(content)
    stripped = content.strip()
    if not stripped:
        return -1, 0
    return text.find(stripped, pos), len(stripped)
