"""Who a chat request belongs to, and which conversation it extends.

Both are derived from the request alone, so every replica computes the same answer:

* ``identify`` names the session: the client's session header, else the body's
  ``user``, else a fingerprint of the API key, the system messages and the first
  user message. Every store key is namespaced by a hash of the API key, so clients
  with different keys never share state, whatever ids they pick.
* ``hash_conversation`` hashes the conversation before each user message (a chained hash, so
  one pass over the messages gives all of them). A store keeps the hash of the
  prefix up to its reset point and honours the reset only for a request whose
  prefix hashes the same: two conversations that share an id-less fingerprint then
  cannot move each other's reset point.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import orjson

from proxy.trimming import head_length
from proxy.types import Message

#: Hex characters of each prefix hash (8 bytes): a collision needs two
#: conversations of one API key and one session id, so 64 bits are plenty.
HASH_HEX = 16
# The fields that make a message what it is. Others (vendor extras, UI metadata)
# may change between requests of one conversation without forking it.
_IDENTITY_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id")
_IDENTITY_SET = frozenset(_IDENTITY_FIELDS)
_ECHO_MAX = 128


@dataclass(frozen=True, slots=True)
class Identity:
    key: str
    """Store key: namespaced by the API key, fixed length whatever the client sent."""
    shown: str
    """The id returned in ``X-Trimproxy-Session-Id``."""
    source: str
    """``header``, ``user`` or ``fingerprint``."""


@dataclass(frozen=True, slots=True)
class ConversationHashes:
    user_starts: tuple[int, ...]
    """Message index of each user message, in order."""
    prefix_hashes: str
    """``HASH_HEX`` hex characters per user message: the hash of all messages before it."""

    @property
    def user_turns(self) -> int:
        return len(self.user_starts)

    def prefix_hash(self, user_index: int) -> str:
        return self.prefix_hashes[user_index * HASH_HEX : (user_index + 1) * HASH_HEX]


def _identity(message: Message) -> Message:
    return {k: message[k] for k in _IDENTITY_FIELDS if k in message}


def _canonical(message: Message) -> bytes:
    return orjson.dumps(_identity(message), option=orjson.OPT_SORT_KEYS)


def _digest(*parts: bytes, size: int = 16) -> str:
    h = hashlib.blake2b(digest_size=size, person=b"trimproxy-sess")
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))  # length-prefixed: no ambiguous joins
        h.update(part)
    return h.hexdigest()


def client_key(headers: Mapping[str, str]) -> str:
    """The key the client sent: its ``Authorization: Bearer`` token, else its
    ``X-Api-Key`` (both are keys to ``middleware.ApiKeys``)."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return token.strip()
    return headers.get("x-api-key", "").strip()


def _echoable(value: str) -> bool:
    return len(value) <= _ECHO_MAX and value.isascii() and value.isprintable()


def identify(
    headers: Mapping[str, str],
    header_name: str,
    user: str | None,
    messages: Sequence[Message],
    also: Sequence[str] = (),
) -> Identity:
    """The session of a request. ``headers`` is case-insensitive (Starlette's);
    ``also``: more header names, read when ``header_name`` is absent."""
    namespace = _digest(b"key", client_key(headers).encode())
    client_id = headers.get(header_name) or next(filter(None, map(headers.get, also)), None)
    if client_id:
        source, raw = "header", client_id
    elif user:
        source, raw = "user", user
    else:
        first_user = next((m for m in messages if m.get("role") == "user"), None)
        parts = [_canonical(m) for m in _leading_head(messages)]
        parts.append(_canonical(first_user) if first_user is not None else b"")
        fingerprint = _digest(namespace.encode(), *parts, size=12)
        return Identity(
            key=f"{namespace[:16]}:f:{fingerprint}",
            shown=f"fp-{fingerprint}",
            source="fingerprint",
        )
    # The client's id is hashed into the key (bounded length, no odd bytes in Redis
    # keys) and echoed back only when it is a safe header value.
    shown = raw if _echoable(raw) else f"id-{_digest(raw.encode(), size=12)}"
    return Identity(
        key=f"{namespace[:16]}:{source[0]}:{_digest(raw.encode(), size=12)}",
        shown=shown,
        source=source,
    )


def _leading_head(messages: Sequence[Message]) -> list[Message]:
    return list(messages[: head_length(messages)])


def hash_conversation(messages: Sequence[Message]) -> ConversationHashes:
    """Prefix hashes at every user message, in one pass over the conversation.

    The hash is chained: one ``orjson`` call and one update per turn, then a copy of
    the running state at each user message (cheaper than hashing message by message).
    """
    h = hashlib.blake2b(digest_size=HASH_HEX // 2, person=b"trimproxy-conv")
    starts: list[int] = []
    hashes: list[str] = []
    pending: list[Message] = []
    for i, message in enumerate(messages):
        if message.get("role") == "user":
            if pending:
                h.update(orjson.dumps(pending, option=orjson.OPT_SORT_KEYS))
                pending = []
            starts.append(i)
            hashes.append(h.copy().hexdigest())
        pending.append(message if message.keys() <= _IDENTITY_SET else _identity(message))
    return ConversationHashes(tuple(starts), "".join(hashes))
