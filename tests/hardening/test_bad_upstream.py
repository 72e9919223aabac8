"""An upstream that answers nonsense, breaks off, or hangs.

Every case runs a real ``trimproxy serve`` against ``tests/support/bad_upstream.py``.
The rule under test: the client never mistakes a failure for success. Before the
answer's head is out, that is a 502/504 envelope; after it, the transfer is broken
off (no last chunk, fewer bytes than declared), and a stream gets a final SSE error
event first (the OpenAI/vLLM ``{"error": {...}}`` shape, which the openai SDK raises
on), whatever dialect the upstream streams in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from proxy.upstream import Upstream
from tests.hardening.raw import CHAT, HELLO, request
from tests.observability.promtext import scrape
from tests.support.bad_upstream import BadUpstream
from tests.support.closing import Closing
from tests.support.inprocess import make_settings
from tests.support.processes import ProxyProcess

StartProxy = Callable[..., ProxyProcess]
# One misbehaving upstream and one proxy serve the module, and most tests wait out a
# read timeout: keep them on one xdist worker (--dist loadgroup) while the others compute.
pytestmark = pytest.mark.xdist_group("bad_upstream")


@pytest.fixture(scope="module")
def _bad_module() -> Iterator[BadUpstream]:
    with BadUpstream() as server:
        yield server


@pytest.fixture
def bad_upstream(_bad_module: BadUpstream) -> BadUpstream:
    """One misbehaving upstream for the module (the proxy below stays pointed at it),
    behaving well again and with nothing recorded at the start of each test."""
    _bad_module.clear()
    return _bad_module


@pytest.fixture(scope="module")
def proxy(
    _bad_module: BadUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    """One proxy for the module: a process start per test would cost more than the tests."""
    server = ProxyProcess(
        settings={
            "tokenizer": "approx",
            "context_window": 4096,
            "read_timeout": 2,
            "upstream_metrics_interval": 0,
        },
        env={"TRIMPROXY_UPSTREAM_URL": _bad_module.url},
        workdir=tmp_path_factory.mktemp("proxy"),
    ).start()
    yield server
    server.stop()


def errors(proxy: ProxyProcess, kind: str) -> float:
    return scrape(proxy.url).value("trimproxy_upstream_errors_total", kind=kind)


@pytest.mark.parametrize("status", [600, 999])
@pytest.mark.parametrize("path", [CHAT, "/v1/models"])
def test_status_outside_http_is_502_protocol_error(
    proxy: ProxyProcess, bad_upstream: BadUpstream, status: int, path: str
) -> None:
    bad_upstream.behave("status", status=status)
    before = errors(proxy, "protocol")
    method, body = ("POST", HELLO) if path == CHAT else ("GET", None)
    answer = request(proxy.url, method, path, body)
    assert answer.status == 502, answer.body
    assert answer.error_code == "upstream_protocol_error"
    message = answer.json()["error"]["message"]
    assert "reached" in message and "invalid" in message
    assert errors(proxy, "protocol") == before + 1


@pytest.mark.parametrize("path", [CHAT, "/v1/models"])
def test_header_that_is_not_latin1_is_502_protocol_error(
    proxy: ProxyProcess, bad_upstream: BadUpstream, path: str
) -> None:
    bad_upstream.behave("bad_header")
    method, body = ("POST", HELLO) if path == CHAT else ("GET", None)
    answer = request(proxy.url, method, path, body)
    assert answer.status == 502, answer.body
    assert answer.error_code == "upstream_protocol_error"
    assert "reached" in answer.json()["error"]["message"]


def test_small_body_cut_off_before_anything_went_out_is_a_clean_502(
    proxy: ProxyProcess, bad_upstream: BadUpstream
) -> None:
    bad_upstream.behave("cut_length", size=4000, sent=1000)
    before = errors(proxy, "protocol")
    answer = request(proxy.url, "POST", CHAT, HELLO)
    assert answer.status == 502, answer.body
    assert answer.error_code == "upstream_protocol_error"
    assert errors(proxy, "protocol") == before + 1


@pytest.mark.parametrize(
    ("behaviour", "options"),
    [
        ("cut_length", {"size": 2 << 20, "sent": 1 << 20}),
        ("cut_chunked", {"sent": 3 << 19}),
    ],
)
@pytest.mark.parametrize("path", [CHAT, "/v1/embeddings"])
def test_large_body_cut_off_mid_answer_breaks_the_transfer(
    closing: Closing,
    proxy: ProxyProcess,
    bad_upstream: BadUpstream,
    behaviour: str,
    options: dict[str, Any],
    path: str,
) -> None:
    bad_upstream.behave(behaviour, **options)
    before = errors(proxy, "protocol")
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(proxy.url + path, json=HELLO, timeout=30)
    client = closing(openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0))
    with pytest.raises(openai.APIError):
        client.chat.completions.create(
            model="bad-model", messages=[{"role": "user", "content": "x"}]
        )
    client.close()
    assert errors(proxy, "protocol") >= before + 2


@pytest.mark.parametrize("dialect", ["vllm", "fastchat"])
def test_stream_cut_off_ends_with_an_error_event_and_a_broken_transfer(
    closing: Closing, proxy: ProxyProcess, bad_upstream: BadUpstream, dialect: str
) -> None:
    bad_upstream.behave("cut_sse", dialect=dialect, events=3)
    before = errors(proxy, "protocol")
    lines: list[str] = []
    with (
        pytest.raises(httpx.RemoteProtocolError),
        httpx.stream("POST", proxy.url + CHAT, json={**HELLO, "stream": True}, timeout=30) as r,
    ):
        assert r.status_code == 200
        lines.extend(line for line in r.iter_lines() if line)
    assert len([line for line in lines if '"delta"' in line]) == 3
    assert lines[-1].startswith('data: {"error"')
    assert "upstream_protocol_error" in lines[-1]
    assert "data: [DONE]" not in lines
    assert errors(proxy, "protocol") == before + 1
    # The openai SDK raises on the error event instead of ending quietly.
    client = closing(openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0))
    stream = client.chat.completions.create(
        model="bad-model", messages=[{"role": "user", "content": "x"}], stream=True
    )
    with pytest.raises(openai.APIError):
        for _chunk in stream:
            pass
    client.close()
    # One warning line per broken answer, no crash report from the server.
    assert "Traceback" not in proxy.logs()
    assert "upstream answer broke off" in proxy.logs()


def test_stream_that_stalls_past_the_read_timeout_breaks_off_with_an_error_event(
    proxy: ProxyProcess, bad_upstream: BadUpstream
) -> None:
    bad_upstream.behave("hang_body")
    before = errors(proxy, "timeout")
    chunks: list[bytes] = []
    with (
        pytest.raises(httpx.RemoteProtocolError),
        httpx.stream("POST", proxy.url + CHAT, json={**HELLO, "stream": True}, timeout=30) as r,
    ):
        chunks.extend(r.iter_raw())
    assert b'data: {"error"' in b"".join(chunks)
    assert b"upstream_timeout" in b"".join(chunks)
    assert errors(proxy, "timeout") == before + 1


def assert_whole_stream(body: bytes, events: int) -> None:
    """Every event of the upstream's answer and its end came through, and no error."""
    assert body.count(b'"content"') == events and body.endswith(b"data: [DONE]\n\n")
    assert b'"error"' not in body


def test_a_stream_slower_than_the_read_timeout_but_never_idle_that_long_completes(
    proxy: ProxyProcess, bad_upstream: BadUpstream
) -> None:
    # 6 events 0.6 s apart: 3.6 s in all against the module's 2 s read timeout. The
    # timeout is kept per read (read_deadline.ReadDeadline), so none of the gaps trips it.
    bad_upstream.behave("slow_sse", events=6, gap=0.6)
    before = errors(proxy, "timeout")
    began = time.monotonic()
    with httpx.stream("POST", proxy.url + CHAT, json={**HELLO, "stream": True}, timeout=30) as r:
        body = b"".join(r.iter_raw())
    assert time.monotonic() - began > 3.0
    assert_whole_stream(body, events=6)
    assert errors(proxy, "timeout") == before


def test_a_client_that_stops_reading_for_longer_than_the_read_timeout_is_no_upstream_timeout(
    proxy: ProxyProcess, bad_upstream: BadUpstream
) -> None:
    # 24 MiB at once: more than the socket buffers hold, so the relay waits on its
    # client's reads for the 3 s the client sleeps (the read timeout is 2 s). The
    # upstream sent everything; only the client was slow.
    bad_upstream.behave("slow_sse", events=192, gap=0, pad=128 << 10)
    before = errors(proxy, "timeout")
    with httpx.stream("POST", proxy.url + CHAT, json={**HELLO, "stream": True}, timeout=30) as r:
        chunks = r.iter_raw()
        first = next(chunks)
        time.sleep(3)
        body = first + b"".join(chunks)
    assert_whole_stream(body, events=192)
    assert errors(proxy, "timeout") == before


def test_a_stream_that_stalls_after_events_times_out_a_read_timeout_after_the_last(
    proxy: ProxyProcess, bad_upstream: BadUpstream
) -> None:
    # 3 events 0.8 s apart, then silence: the read timeout (2 s) counts from the last
    # event, not from the head. Shown by order, not by a stopwatch: a deadline counted
    # from the head (2 s) would fall before the third event (2.4 s) and cut it off.
    bad_upstream.behave("hang_body", events=3, gap=0.8)
    seen: list[str] = []
    with (
        pytest.raises(httpx.RemoteProtocolError),
        httpx.stream("POST", proxy.url + CHAT, json={**HELLO, "stream": True}, timeout=30) as r,
    ):
        for chunk in r.iter_raw():
            seen += ["content"] * chunk.count(b'"content"')
            seen += ["error"] * chunk.count(b'data: {"error"')
    assert seen == ["content", "content", "content", "error"]


def test_hung_upstream_is_504_naming_the_read_timeout(
    proxy: ProxyProcess, bad_upstream: BadUpstream
) -> None:
    bad_upstream.behave("hang", path=CHAT)
    answer = request(proxy.url, "POST", CHAT, HELLO)
    assert answer.status == 504, answer.body
    assert answer.error_code == "upstream_timeout"
    message = answer.json()["error"]["message"]
    assert "TRIMPROXY_READ_TIMEOUT" in message and "2 s" in message


def test_window_discovery_obeys_the_read_timeout_and_backs_off(
    proxy_server: StartProxy, bad_upstream: BadUpstream
) -> None:
    """No TRIMPROXY_CONTEXT_WINDOW: the proxy asks /v1/models, which hangs. Each call
    waits at most the configured read timeout, and a failed discovery is not retried
    by the very next requests (backoff), so they do not each wait again. The backoff
    is an hour here, so that no request of the test can fall after it however slow
    the machine is; when it runs out is the clock's business
    (``test_model_discovery_is_tried_again_only_once_the_backoff_has_passed``)."""
    bad_upstream.behave("hang", path="/v1/models")
    bad_upstream.behave("hang", path="/api/v1/token_check")
    proxy = proxy_server(
        upstream=bad_upstream.url,
        tokenizer="approx",
        read_timeout=1,
        upstream_metrics_interval=0,
        models_retry=3600,
    )
    for _ in range(4):
        answer = request(proxy.url, "POST", CHAT, HELLO)
        assert answer.status == 200, answer.body
    discovery = [p for p in bad_upstream.paths() if p in ("/v1/models", "/api/v1/token_check")]
    assert discovery == ["/v1/models"], bad_upstream.paths()
    assert bad_upstream.paths().count(CHAT) == 4


async def test_model_discovery_is_tried_again_only_once_the_backoff_has_passed(
    bad_upstream: BadUpstream,
) -> None:
    """The served-model list of a failing upstream is asked again after the backoff
    (``TRIMPROXY_MODELS_RETRY``, doubled per failure) and not before, by the upstream
    client's clock; once the upstream lists models, the list is kept for the TTL."""
    bad_upstream.behave("status", path="/v1/models", status=600)
    now = 1000.0
    upstream = Upstream(
        make_settings(
            bad_upstream.url, upstream_metrics_interval=0, models_refresh=300, models_retry=10
        ),
        clock=lambda: now,
    )

    async def asked_after(seconds: float) -> int:
        nonlocal now
        now += seconds
        await upstream.models()
        return bad_upstream.paths().count("/v1/models")

    try:
        assert await asked_after(0) == 1
        assert await asked_after(9.9) == 1  # within the first 10 s
        assert await asked_after(0.2) == 2
        assert await asked_after(19.9) == 2  # the second failure doubled it
        assert await asked_after(0.2) == 3
        bad_upstream.behave("ok", path="/v1/models")
        assert await asked_after(39.9) == 3
        assert await asked_after(0.2) == 4
        assert [m.id for m in await upstream.models()] == ["bad-model"]
        assert await asked_after(299.9) == 4  # a listing is kept for the TTL
        assert await asked_after(0.2) == 5
    finally:
        await upstream.aclose()
