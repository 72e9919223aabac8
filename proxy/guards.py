"""What a prompt route refuses before its handler runs (docs/architecture.md §3).

A prompt route reads its body as plain JSON and rewrites it: a body labelled with a
``Content-Encoding`` other than ``identity`` is refused with 415 (the proxy does not
decode request bodies), and the header is taken out of the scope, so it never goes
upstream with a body the proxy rewrote.
"""

from __future__ import annotations

from starlette.types import Scope

from proxy.errors import UnsupportedEncoding

_ENCODING = b"content-encoding"
_LENGTH = len(_ENCODING)


def prompt_guard(scope: Scope, prompt_paths: frozenset[str]) -> Scope:
    """The scope of a prompt route (``prompt_paths``: the dialect table's) without its
    ``Content-Encoding``; raises ``UnsupportedEncoding`` for any coding but
    ``identity``. Other routes as they are."""
    if scope["path"] not in prompt_paths:
        return scope
    headers = scope["headers"]
    # Every prompt request asks: a loop, not any() over a generator (a frame resumed
    # per header), and a name of another length never lowered (docs/performance.md §6).
    for name, _ in headers:
        if len(name) == _LENGTH and name.lower() == _ENCODING:
            break
    else:
        return scope
    for name, value in headers:
        if name.lower() == _ENCODING and value.strip().lower() not in (b"identity", b""):
            coding = value.decode("latin-1")[:32]
            raise UnsupportedEncoding(
                f"Content-Encoding '{coding}' is not accepted on {scope['path']}: this "
                "proxy reads and trims the prompt, so it takes the body as plain JSON. "
                "Send it without Content-Encoding."
            )
    kept = [(name, value) for name, value in headers if name.lower() != _ENCODING]
    return {**scope, "headers": kept}
