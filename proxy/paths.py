"""The path rule (docs/architecture.md §3): one normal form, routed and forwarded as is.

A request path is normalised once, before anything looks at it:

1. It must be ASCII, start with ``/`` and hold only well-formed percent escapes;
   control characters, ``%00`` and a backslash (raw or ``%5C``) are refused.
2. Encoded slashes (``%2F``) are refused, not decoded: decoding them would let one
   segment become two (``/v1/..%2fmetrics``), and keeping them would leave the
   upstream (or a server in front of it) to decide what they mean. No OpenAI route
   needs one.
3. Escapes of unreserved characters (letters, digits, ``-._~``, so ``%2e`` too) are
   decoded, and the hex of the remaining escapes upper-cased (RFC 3986 6.2.2).
4. Dot segments are removed (RFC 3986 5.2.4), empty segments merged (``//``) and a
   trailing slash dropped, because servers an upstream may sit behind (nginx's
   ``merge_slashes``, ``redirect_slashes``) treat those as the same path.

The result is what the proxy routes on *and* what it sends upstream, so a chat
request always reaches the chat handler (and is trimmed), and the upstream never
sees a path the proxy did not route. A path that normalisation changed must still
be one the proxy forwards (under ``/v1/``, or exactly ``/tokenize``/``/detokenize``);
one that walked out of that space, to the upstream's ``/metrics`` or an admin route,
is refused with 400, as is any path that leaves ``/v1/`` by its dot segments.
Pure: no I/O, no settings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

FORWARDED_PREFIX = "/v1/"
FORWARDED_EXACT = frozenset(("/tokenize", "/detokenize"))
#: The routes that carry a prompt to the engine: each has a handler of its own that
#: bounds it (docs/architecture.md §22), POST only; every other forwarded path is
#: relayed blind (or refused: TRIMPROXY_BLIND_ROUTES).
PROMPT_PATHS = frozenset(
    (
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
    )
)

# What a spelling of a prompt route may trail its last segment with: anything but a
# letter, digit or underscore.
_TRAILING_JUNK = re.compile(r"[^a-z0-9_]+$")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_HEX = frozenset("0123456789abcdefABCDEF")
# Characters allowed raw in a path by RFC 3986 (pchar and "/"), plus "%" for escapes.
_PATH_CHARS = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/%]*")
#: Escapes refused outright: a slash, a backslash, and NUL.
_REFUSED_ESCAPES = frozenset(("2F", "5C", "00"))


class BadPath(ValueError):
    """The path cannot be routed; ``reason`` says why, for a 400 message."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# Not frozen: read-only by convention (why: proxy.types, above PromptCount).
@dataclass(slots=True)
class RoutedPath:
    path: str
    """The normalised path, percent-encoded: routed on and forwarded byte for byte."""
    changed: bool
    """Whether normalisation changed the path the client sent."""


def is_forwarded(path: str) -> bool:
    """Whether a normalised path is one the proxy may send upstream."""
    return path.startswith(FORWARDED_PREFIX) or path in FORWARDED_EXACT


def normalise(raw_path: str) -> str:
    """The normal form of a request path (the part before ``?``); raises ``BadPath``."""
    if not raw_path.startswith("/"):
        raise BadPath("The request path must start with '/'.")
    if not raw_path.isascii() or _PATH_CHARS.fullmatch(raw_path) is None:
        raise BadPath(
            "The request path holds characters that must be percent-encoded "
            "(spaces, controls, backslashes or non-ASCII)."
        )
    return _join(_remove_dot_segments(_decode_unreserved(raw_path).split("/")[1:]))


def _decode_unreserved(path: str) -> str:
    if "%" not in path:
        return path
    out: list[str] = []
    i = 0
    while i < len(path):
        char = path[i]
        if char != "%":
            out.append(char)
            i += 1
            continue
        pair = path[i + 1 : i + 3]
        if len(pair) != 2 or not set(pair) <= _HEX:
            raise BadPath("The request path holds a malformed percent escape.")
        pair = pair.upper()
        if pair in _REFUSED_ESCAPES:
            raise BadPath(
                "The request path holds an encoded slash, backslash or NUL (%2F, %5C, %00); "
                "this proxy does not route those. Send the path with plain '/' separators."
            )
        decoded = chr(int(pair, 16))
        out.append(decoded if decoded in _UNRESERVED else f"%{pair}")
        i += 3
    return "".join(out)


def _remove_dot_segments(segments: list[str]) -> list[str]:
    """RFC 3986 5.2.4 on a segment list; empty segments are merged on the way."""
    kept: list[str] = []
    for segment in segments:
        if segment == "..":
            if kept:
                kept.pop()
        elif segment not in (".", ""):
            kept.append(segment)
    return kept


def _join(segments: list[str]) -> str:
    return "/" + "/".join(segments)


def route(raw_path: str) -> RoutedPath:
    """Normalise ``raw_path`` and check it against the rule; raises ``BadPath``.

    A path the client sent in normal form is routed as it is (an unknown one then
    gets the router's 404). A path that normalisation changed is routed only when
    the result is one the proxy forwards; anything else was an attempt to reach past
    ``/v1/`` (or a confused client) and is refused.
    """
    path = normalise(raw_path)
    changed = path != raw_path
    if changed and not is_forwarded(path):
        raise BadPath(
            "The request path leaves /v1/ once its dot segments are resolved; the proxy "
            "forwards only paths under /v1/ and exactly /tokenize and /detokenize."
        )
    if raw_path.startswith(FORWARDED_PREFIX) and not path.startswith(FORWARDED_PREFIX):
        raise BadPath("The request path leaves /v1/ once its dot segments are resolved.")
    return RoutedPath(path, changed)


def spelled_prompt_path(path: str) -> str | None:
    """The prompt route that ``path`` (in normal form) spells without being it: with
    segment parameters (``/v1/responses;x=1``), escaped or trailing blanks and junk
    (``/v1/messages%20``), or another case. Such a path would be relayed blind with
    the whole prompt (and an upstream may route it as the prompt route), so it is
    answered 404, never forwarded (docs/dialects.md)."""
    if path in PROMPT_PATHS or not path.startswith(FORWARDED_PREFIX):
        return None
    segments = path.split("/")[1:]
    cleaned = [_cleaned(segment) for segment in segments]
    for prompt in PROMPT_PATHS:
        want = prompt.split("/")[1:]
        if cleaned[: len(want)] == want and segments[: len(want)] != want:
            return prompt
    return None


def _cleaned(segment: str) -> str:
    bare = unquote(segment).split(";", 1)[0].strip().lower()
    return _TRAILING_JUNK.sub("", bare)
