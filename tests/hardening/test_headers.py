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
