"""The neutral conversation every dialect parses into, and the pieces they share.

Trimming (``proxy.trimming``) reads only each item's role, so a dialect's whole rule
for what may be dropped is the ``roles`` it gives (chat: its messages) or the kinds and
pair keys ``roles`` is built from on first read (``kinds_of``): ``system``/``developer`` for
the pinned head, ``user`` only where a turn may start, ``assistant`` or ``tool`` for
everything else. ``turn_roles`` holds the one rule the dialects share: a user item
that stands inside a tool call/result pair does not open a turn, so dropping whole
turns from the front never splits a pair.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.choices import Endpoint
from proxy.errors import InvalidRequest
from proxy.trimming import HEAD_ROLES
from proxy.types import JSONObject, Message


# Not frozen: read-only by convention (why: proxy.types, above PromptCount).
@dataclass(slots=True)
class Conversation:
    endpoint: Endpoint
    body: JSONObject
    """The parsed client body; never modified (``render`` copies it)."""
    items: list[Any]
    """The trimmable units in order, each the client's own object; the pinned head first."""
    head: int
    """How many leading items are synthesized head items that live outside the body's
    item list (Responses ``instructions``, Messages ``system``)."""
    model: str | None
    stream: bool
    max_tokens: int | None
    """The client's own completion bound, a positive integer or None."""
    user: str | None
    """An identity hint for sessions."""
    tools: list[JSONObject] | None
    """The tools in the chat form vLLM hands to the chat template (for counting)."""
    n: int = 1
    """Answers asked for per prompt."""
    kinds_of: Callable[[Conversation], tuple[Sequence[str], Sequence[Iterable[str]]]] | None = None
    """Each item's own role and the pair ids it carries (``turn_roles``), worked out
    from the items on the first read of ``roles`` where the dialect does not give the
    roles outright (Responses, Messages): a prompt that fits and has no session never
    needs them (docs/performance.md §5b)."""
    given_roles: list[Message] | None = None
    """The turn roles where the dialect has them outright (chat: its messages)."""
    plain_view: list[Message] | None = None
    """The chat view of every item, where the parse found each item a chat message as
    it stands (a Responses list of plain messages): counted as it is, one message an
    item, with no conversion to run (docs/performance.md §5b)."""
    plain_for: list[Any] | None = None
    """The ``items`` that view is of: a copy with other items (``dataclasses.replace``)
    is not taken for it."""
    holds_tool_role: bool | None = None
    """Whether a turn role is ``tool``, where the parse saw every role (chat's); None:
    not known, ``roles`` is read to tell."""
    holds_compaction: bool | None = None
    """Whether an item is a compaction item or trigger, where the parse saw every item
    (Responses'); None: not known, the items are read to tell."""

    @property
    def roles(self) -> list[Message]:
        """One ``{"role": r}`` per item: what trimming reads. Built on first read from
        ``kinds_of`` where not given: a prompt that fits and has no session never reads
        them (docs/performance.md §5b)."""
        roles = self.given_roles
        if roles is None:
            kinds, keys = ((), ()) if self.kinds_of is None else self.kinds_of(self)
            roles = self.given_roles = turn_roles(kinds, keys)
        return roles


def object_list(body: JSONObject, name: str, what: str) -> list[JSONObject] | None:
    """``body[name]`` as a list of objects (``what`` names one in the message)."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, list):
        raise InvalidRequest(f"'{name}' must be a list of {what} objects.", param=name)
    for i, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise InvalidRequest(f"{name}[{i}] must be an object.", param=name)
    return value


def turn_roles(kinds: Sequence[str], keys: Sequence[Iterable[str]]) -> list[Message]:
    """The trimming view of a dialect's items.

    ``kinds[i]`` is the role the item would have on its own: a head role for the
    pinned head (kept only while every item before it is head too), ``user`` for an
    item that may open a turn, anything else for the rest. ``keys[i]`` are the pair
    ids the item carries (a call's id, a result's id). A user item inside a pair's
    span (after the pair's first item, up to its last) does not open a turn: the
    turn before it would end between a call and its result, and dropping it would
    split the pair. Such an item becomes ``tool``.
    """
    n = len(kinds)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, ids in enumerate(keys):
        for key in ids:
            first.setdefault(key, i)
            last[key] = i
    # covered[u] > 0 where some span (a, b] holds u: a difference array over the spans.
    delta = [0] * (n + 1)
    for key, a in first.items():
        b = last[key]
        if b > a:
            delta[a + 1] += 1
            delta[b + 1] -= 1
    roles: list[Message] = []
    depth = 0
    in_head = True
    for i, kind in enumerate(kinds):
        depth += delta[i]
        if in_head and kind in HEAD_ROLES:
            roles.append({"role": kind})
            continue
        in_head = False
        if kind == "user":
            roles.append({"role": "tool" if depth > 0 else "user"})
        else:
            roles.append({"role": "tool" if kind == "tool" else "assistant"})
    return roles


def rendered(
    conv: Conversation,
    field: str,
    kept: Sequence[int],
    updates: dict[str, Any],
) -> bytes:
    """The body with ``field`` holding the kept items after the head (each the client's
    own object) and ``updates`` written over it; every other field as it came."""
    body = dict(conv.body)
    items = conv.items
    body[field] = [items[i] for i in kept if i >= conv.head]
    body.update(updates)
    return orjson.dumps(body)


def json_object(raw: bytes) -> JSONObject | None:
    """An answer's JSON object, None when it is not one."""
    try:
        value: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
