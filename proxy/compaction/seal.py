"""The sealed ``encrypted_content`` of a compaction item (docs/architecture.md §24).

zlib, then AES-256-GCM (the ``cryptography`` package; nothing hand-rolled): the item
is opaque to the client, and one that was changed, made under another API key (the
key's digest is the associated data) or by another deployment (another key) does not
open. The token: ``tpc1.`` then url-safe base64 of key id (4 bytes), nonce (12 bytes)
and the ciphertext; the key id only picks the wording of the refusal.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import zlib

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from proxy.errors import InvalidRequest

PREFIX = "tpc1."
KEY_BYTES = 32
_NONCE = 12
_KEY_ID = 4


class CompactionRefused(InvalidRequest):
    code = "invalid_compaction_item"


def _refused(why: str) -> CompactionRefused:
    return CompactionRefused(
        f"A 'compaction' input item {why}. Send the items compaction returned to this "
        "deployment under the same API key, unchanged, or send the conversation itself.",
        param="input",
    )


def key_from_text(text: str) -> bytes:
    """A 32-byte key from ``TRIMPROXY_COMPACTION_KEY``: 64 hex digits or url-safe
    base64 of 32 bytes are the key itself; any other text is hashed to one."""
    text = text.strip()
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raw = b""
    if len(raw) != KEY_BYTES:
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            raw = b""
    if len(raw) != KEY_BYTES:
        raw = hashlib.sha256(b"trimproxy-compaction-key\0" + text.encode()).digest()
    return raw


def identity(client_key: str) -> bytes:
    """The associated data: a digest of the client's API key (never the key itself)."""
    return hashlib.blake2b(client_key.encode(), digest_size=16, person=b"trimproxy-cmpk").digest()


class Sealer:
    def __init__(self, key: bytes, max_bytes: int) -> None:
        self._aead = AESGCM(key)
        self.key_id = hashlib.blake2b(key, digest_size=_KEY_ID, person=b"trimproxy-ckid").digest()
        self.max_bytes = max_bytes

    def seal(self, payload: bytes, client_key: str) -> str | None:
        """The token for ``payload``; None when it is over ``max_bytes``."""
        nonce = os.urandom(_NONCE)
        sealed = self._aead.encrypt(nonce, zlib.compress(payload, 6), identity(client_key))
        token = PREFIX + base64.urlsafe_b64encode(self.key_id + nonce + sealed).decode("ascii")
        return token if len(token) <= self.max_bytes else None

    def open(self, token: object, client_key: str) -> bytes:
        """The payload a token seals, else the client's 400."""
        if not isinstance(token, str) or not token.startswith(PREFIX):
            raise _refused("has no 'encrypted_content' made by this proxy")
        if len(token) > self.max_bytes:
            raise _refused(f"is over TRIMPROXY_COMPACTION_MAX_BYTES ({self.max_bytes})")
        try:
            raw = base64.urlsafe_b64decode(token[len(PREFIX) :])
        except (binascii.Error, ValueError):
            raise _refused("has an 'encrypted_content' that is not this proxy's") from None
        head = _KEY_ID + _NONCE
        if len(raw) <= head:
            raise _refused("has an 'encrypted_content' that is not this proxy's")
        if raw[:_KEY_ID] != self.key_id:
            raise _refused(
                "was made by another deployment or under another TRIMPROXY_COMPACTION_KEY"
            )
        try:
            data = self._aead.decrypt(raw[_KEY_ID:head], raw[head:], identity(client_key))
        except InvalidTag:
            raise _refused("was changed, or made under another API key") from None
        inflate = zlib.decompressobj()
        # Bounded: what it unpacks to is at most 64 times the bound of the token.
        payload = inflate.decompress(data, 64 * self.max_bytes)
        if inflate.unconsumed_tail:
            raise _refused("unpacks to more than this proxy takes")
        return payload
