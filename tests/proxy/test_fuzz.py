"""Fuzzing a running proxy + sim with hypothesis-made paths and bodies.

Every answer must be one of: forwarded unchanged (the sim received the client's
bytes), trimmed by the rules (the sim received a subsequence of the messages that
keeps the system head and the last user turn), or a 4xx OpenAI envelope. Never a
500, never a dropped connection, and never a path outside ``/v1/`` (or exactly
``/tokenize``/``/detokenize``) reaching the upstream: the sim's recorded raw
request targets are checked after every example.

Bounded for CI: a few hundred examples in all, no deadline (the machine is shared).
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.processes import ProxyProcess
from tests.support.properties import examples
from tests.support.sim import SimUpstream

StartProxy = Callable[..., ProxyProcess]
CHAT = "/v1/chat/completions"
FORWARDED_EXACT = ("/tokenize", "/detokenize")
FUZZ = settings(
    max_examples=examples(120),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# -- strategies -------------------------------------------------------------------

_segments = st.sampled_from(
    ["v1", "chat", "completions", "models", "embeddings", "tokenize", "metrics", "health",
     "x", ".", "..", "%2e", "%2E%2e", "%2f", "%2F", "..%2f", "%5c", "", ";a", "%41", "%00",
     "_sim", "api", "%252e", "a%20b", "~"]
)  # fmt: skip
paths = st.one_of(
    st.lists(_segments, min_size=1, max_size=7).map(lambda s: "/" + "/".join(s)),
    st.lists(_segments, max_size=4).map(lambda s: "/v1/" + "/".join(s) + "/chat/completions"),
    st.just(CHAT),
)
queries = st.one_of(st.just(""), st.sampled_from(["?a=1", "?x=%2e%2e", "?path=/metrics"]))

_text = st.text(max_size=40)
_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), _text)
_json = st.recursive(
    _json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
_content = st.one_of(
    _text,
    st.none(),
    st.integers(),
    st.lists(
        st.one_of(st.fixed_dictionaries({"type": st.just("text"), "text": _text}), _json),
        max_size=3,
    ),
    _json,
)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "x", 5])},
    optional={
        "content": _content,
        "name": st.one_of(_text, _json),
        "tool_calls": _json,
        "tool_call_id": _text,
    },
)
_chat = st.fixed_dictionaries(
    {"messages": st.lists(_message, max_size=8)},
    optional={
        "model": st.one_of(st.just("sim-model"), _text, st.integers(), st.text(min_size=300)),
        "max_tokens": st.one_of(st.integers(-5, 5000), _text, st.none()),
        "max_completion_tokens": st.integers(-5, 5000),
        "stream": st.one_of(st.booleans(), _text),
        "user": st.one_of(_text, _json),
        "extra": _json,
    },
)


def _deep(depth: int) -> bytes:
    return (
        b'{"model": "sim-model", "messages": [{"role": "user", "content": '
        + (b"[" * depth + b"1" + b"]" * depth)
        + b"}]}"
    )


bodies = st.one_of(
    _chat.map(lambda b: json.dumps(b).encode()),
    st.binary(max_size=64),
    _json.map(lambda v: json.dumps(v).encode()),
    st.integers(200, 1100).map(_deep),
)

# -- the checks -------------------------------------------------------------------


def send(
    url: str, method: str, target: str, body: bytes | None
) -> tuple[int, dict[str, str], bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    try:
        headers = {"content-type": "application/json"}
        conn.request(method, target, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()  # a dropped connection raises here and fails the test
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data
    finally:
        conn.close()


def assert_upstream_saw_only_v1(sim: SimUpstream) -> list[dict[str, Any]]:
    records = sim.requests()
    for record in records:
        target = record["raw_path"].partition("?")[0]
        assert target.startswith("/v1/") or target in FORWARDED_EXACT, target
        # Nothing an upstream (or a server in front of it) could resolve elsewhere:
        # no dot segments, encoded or not, no empty segments, no encoded slashes.
        segments = [unquote(s) for s in target.split("/")[1:]]
        assert not {".", "..", ""} & set(segments), target
        assert "%2f" not in target.lower() and "%5c" not in target.lower(), target
        assert record["path"] == target or "%" in target
    return records


def assert_valid_answer(status: int, data: bytes, body: bytes, records: list[dict[str, Any]],
                        headers: dict[str, str]) -> None:  # fmt: skip
    assert status != 500 and status < 600, (status, data[:500])
    if status >= 400:
        if status >= 500:
            # Only the upstream's own answer may be 5xx (e.g. it refused the body);
            # the proxy passed it through unchanged.
            assert records, (status, data[:500])
            return
        payload = json.loads(data)
        assert isinstance(payload, dict) and "error" in payload, data[:500]
        return
    chats = [r for r in records if r["path"] == CHAT]
    if not chats:
        return  # another /v1 route, passed through
    (record,) = chats
    trimmed = headers.get("x-trimproxy-trimmed-messages", "0")
    if trimmed == "0":
        assert record["body"].encode("utf-8", "surrogateescape") == body or (
            record["body"] == body.decode("utf-8", "replace")
        )
        return
    sent = json.loads(body)["messages"]
    kept = record["json"]["messages"]
    assert len(kept) == len(sent) - int(trimmed)
    assert kept[-1] == sent[-1]
    it = iter(sent)
    assert all(any(m == s for s in it) for m in kept), "not a subsequence"


@pytest.fixture
def fuzz_proxy(proxy_server: StartProxy, sim_upstream: SimUpstream) -> ProxyProcess:
    return proxy_server(
        tokenizer="approx",
        max_prompt_tokens=200,
        session_max_turns=1000,
        max_body_bytes=65536,
        upstream_metrics_interval=0,
    )


@FUZZ
@given(path=paths, query=queries, method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]))
def test_fuzzed_paths_never_reach_outside_v1(
    fuzz_proxy: ProxyProcess, sim_upstream: SimUpstream, path: str, query: str, method: str
) -> None:
    sim_upstream.clear()
    body = json.dumps({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]})
    status, _headers, data = send(
        fuzz_proxy.url, method, path + query, body.encode() if method != "GET" else None
    )
    records = assert_upstream_saw_only_v1(sim_upstream)
    assert status != 500 and status < 600, (status, data[:300])
    if status >= 400 and not records:
        assert "error" in json.loads(data), data[:300]


@FUZZ
@given(body=bodies)
def test_fuzzed_chat_bodies_are_forwarded_trimmed_or_refused(
    fuzz_proxy: ProxyProcess, sim_upstream: SimUpstream, body: bytes
) -> None:
    sim_upstream.clear()
    status, headers, data = send(fuzz_proxy.url, "POST", CHAT, body)
    records = assert_upstream_saw_only_v1(sim_upstream)
    assert_valid_answer(status, data, body, records, headers)
