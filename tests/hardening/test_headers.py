"""Which client headers travel upstream.

* headers the client's ``Connection`` header names are hop-by-hop (RFC 9110 7.6.1)
  and dropped, like ``Connection`` itself;
* ``Cookie`` is never forwarded: the model server has no use for a browser's
  cookies for the proxy's site;
* ``X-Api-Key`` is a credential like ``Authorization`` and travels under the same
  rule: only through a transparent proxy (no ``TRIMPROXY_API_KEYS``, no
  ``TRIMPROXY_UPSTREAM_API_KEY``); otherwise the upstream key goes as
  ``Authorization`` and nothing else;
* everything else (``X-Request-ID``, custom ``X-*``) passes.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.hardening.raw import request
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

StartProxy = Callable[..., ProxyProcess]
HELLO = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
HEADERS = {
    "connection": "keep-alive, X-Secret-Hop, x-other-hop",
    "x-secret-hop": "1",
    "x-other-hop": "2",
    "cookie": "session=abc",
    "x-api-key": "sk-client",
    "authorization": "Bearer sk-client",
    "x-custom": "kept",
    "x-request-id": "req-123",
}


def sent_headers(
    proxy: ProxyProcess, sim: SimUpstream, key: str | None = None
) -> list[dict[str, str]]:
    headers = dict(HEADERS)
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    for path, body in (("/v1/chat/completions", HELLO), ("/v1/embeddings", {"input": "x"})):
        answer = request(proxy.url, "POST", path, body, headers=headers)
        assert answer.status == 200, answer.body
    records = [r for r in sim.requests() if r["path"] != "/v1/models"]
    assert len(records) == 2
    return [{name.lower(): value for name, value in r["headers"]} for r in records]


@pytest.mark.parametrize("mode", ["transparent", "upstream_key", "proxy_keys"])
def test_hop_by_hop_and_credentials(
    proxy_server: StartProxy, sim_upstream: SimUpstream, mode: str
) -> None:
    settings: dict[str, object] = {"tokenizer": "approx", "upstream_metrics_interval": 0}
    key = None
    if mode == "upstream_key":
        settings["upstream_api_key"] = "sk-upstream"
    if mode == "proxy_keys":
        settings["api_keys"] = "sk-proxy"
        key = "sk-proxy"
    proxy = proxy_server(**settings)
    for sent in sent_headers(proxy, sim_upstream, key):
        assert not set(sent) & {"x-secret-hop", "x-other-hop", "cookie"}, sent
        assert sent["x-custom"] == "kept" and sent["x-request-id"] == "req-123"
        if mode == "transparent":
            assert sent["x-api-key"] == "sk-client"
            assert sent["authorization"] == "Bearer sk-client"
        else:
            assert "x-api-key" not in sent
            expected = "Bearer sk-upstream" if mode == "upstream_key" else None
            assert sent.get("authorization") == expected


def test_proxy_keys_by_bearer_or_x_api_key_and_a_wrong_scheme_said(
    proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    """``TRIMPROXY_API_KEYS`` takes a key as ``Authorization: Bearer`` or as
    ``X-Api-Key`` (Anthropic's clients); another scheme is named in the 401, not
    called a missing key. The proxy's key goes upstream in neither header."""
    proxy = proxy_server(tokenizer="approx", upstream_metrics_interval=0, api_keys="sk-proxy")
    path = "/v1/chat/completions"
    answer = request(proxy.url, "POST", path, HELLO, headers={"x-api-key": "sk-proxy"})
    assert answer.status == 200, answer.body
    (record,) = sim_upstream.chat_requests()
    sent = {name.lower(): value for name, value in record["headers"]}
    assert "x-api-key" not in sent and "authorization" not in sent, sent

    refused = {
        "Basic c2stcHJveHk6": "The Authorization scheme must be Bearer, not Basic.",
        "Bearer sk-wrong": "The API key is not valid.",
        "": "The API key was missing.",
    }
    for auth, said in refused.items():
        headers = {"authorization": auth} if auth else {}
        answer = request(proxy.url, "POST", path, HELLO, headers=headers)
        assert answer.status == 401, answer.body
        message = json.loads(answer.body)["error"]["message"]
        assert message.startswith(said), message
        assert "X-Api-Key" in message and "Bearer" in message
    wrong = request(proxy.url, "POST", path, HELLO, headers={"x-api-key": "sk-wrong"})
    assert wrong.status == 401
    assert len(sim_upstream.chat_requests()) == 1
