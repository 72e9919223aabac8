"""``prompt_guard``: a prompt route's Content-Encoding, read in any case."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.errors import UnsupportedEncoding
from proxy.guards import prompt_guard

PROMPTS = frozenset(("/v1/chat/completions",))
HEADERS = [(b"host", b"proxy"), (b"content-type", b"application/json")]


def _scope(path: str, *headers: tuple[bytes, bytes]) -> dict[str, Any]:
    return {"type": "http", "path": path, "headers": [*HEADERS, *headers]}


def test_a_scope_without_the_header_is_the_same_scope() -> None:
    scope = _scope("/v1/chat/completions", (b"x-content-encoding", b"gzip"))
    assert prompt_guard(scope, PROMPTS) is scope


@pytest.mark.parametrize("name", [b"content-encoding", b"Content-Encoding", b"CONTENT-ENCODING"])
def test_a_coding_is_refused_whatever_the_names_case(name: bytes) -> None:
    with pytest.raises(UnsupportedEncoding) as info:
        prompt_guard(_scope("/v1/chat/completions", (name, b"gzip")), PROMPTS)
    assert "'gzip'" in info.value.message


@pytest.mark.parametrize("value", [b"identity", b" Identity ", b""])
def test_identity_is_taken_out_of_the_scope(value: bytes) -> None:
    scope = _scope("/v1/chat/completions", (b"Content-Encoding", value))
    guarded = prompt_guard(scope, PROMPTS)
    assert guarded["headers"] == HEADERS
    assert scope["headers"][-1] == (b"Content-Encoding", value)  # the client's scope as it was


def test_another_route_keeps_its_coding() -> None:
    scope = _scope("/v1/embeddings", (b"content-encoding", b"gzip"))
    assert prompt_guard(scope, PROMPTS) is scope
