"""Finding a tokenizer's added tokens in rendered text, the way ``tokenizers`` does.

``tokenizers`` cuts the input at its added tokens (``<|im_start|>``, BOS, ...) before
it normalizes or pre-tokenizes anything, and encodes each piece between them on its
own. So a rendered prompt's count is the number of added-token matches plus the
counts of the runs between them, and a run's count can be cached by its text. The
matching here mirrors the library's: leftmost-longest, with the ``lstrip`` /
``rstrip`` / ``single_word`` flags. Whether it agrees on a given tokenizer is not
assumed: ``HFCounter`` checks it against the tokenizer at start-up.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class AddedToken:
    content: str
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False


def _trie_pattern(words: Iterable[str]) -> str:
    """One regex for many literals, factored by common prefixes.

    An alternation of 800 literals is tried literal by literal at every '<'; a trie
    is tried once. A longer continuation is preferred to stopping, so the match is
    the longest, as in the library's Aho-Corasick matcher.
    """
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = True

    def emit(node: dict[str, Any]) -> str:
        ends = "" in node
        alts = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        if ends:
            return "(?:" + body + ")?"
        return body

    return emit(trie)


class AddedTokenSplitter:
    """Spans of added-token matches in a text."""

    def __init__(self, tokens: Iterable[AddedToken]) -> None:
        groups: dict[tuple[bool, bool, bool], list[str]] = {}
        for token in tokens:
            if token.content:
                flags = (token.lstrip, token.rstrip, token.single_word)
                groups.setdefault(flags, []).append(token.content)
        alternatives = []
        for (lstrip, rstrip, single_word), words in sorted(groups.items()):
            core = _trie_pattern(words)
            if single_word:
                core = r"(?<!\w)" + core + r"(?!\w)"
            alternatives.append((r"\s*" if lstrip else "") + core + (r"\s*" if rstrip else ""))
        self.pattern: re.Pattern[str] | None = (
            re.compile("|".join(alternatives)) if alternatives else None
        )
        # The same pattern as one group (it has no other: the trie and the flags use
        # only non-capturing ones), so that re.split keeps the matches.
        self._splitter: re.Pattern[str] | None = (
            re.compile("(" + self.pattern.pattern + ")") if self.pattern is not None else None
        )

    def split(self, text: str) -> list[str]:
        """The text cut at its added tokens: ``[run, token, run, ..., token, run]``,
        runs at even places (empty where two tokens meet) and matches at odd ones.

        One C call that builds the strings themselves: no match objects, no slicing."""
        if self._splitter is None:
            return [text]
        return self._splitter.split(text)

    def spans(self, text: str) -> list[tuple[int, int]]:
        if self.pattern is None:
            return []
        # No match is empty (every token has content, and \s* only widens one), so
        # the spans are taken as they come, without a Python call per match.
        return list(map(re.Match.span, self.pattern.finditer(text)))
