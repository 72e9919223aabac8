"""Serving limits (docs/architecture.md §16): clients that stall or leave hold nothing.

* a body that stalls is answered 408 after ``TRIMPROXY_BODY_TIMEOUT``;
* a request counts against ``TRIMPROXY_MAX_IN_FLIGHT`` (and in the in-flight gauge)
  only once its body is in, so stalled uploads never lock others out;
* a connection that never finishes its headers is closed after
  ``TRIMPROXY_HEADER_TIMEOUT``, an idle keep-alive one after ``TRIMPROXY_IDLE_TIMEOUT``;
* a client that leaves mid-body is a 499 in the access log and the metrics, with
  no traceback.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx

from tests.hardening.raw import chat_head, open_socket, read_all, wait_until_read
from tests.observability.promtext import scrape, wait_for_scrape
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

StartProxy = Callable[..., ProxyProcess]
CHAT = "/v1/chat/completions"
BODY = json.dumps(
    {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
).encode()


def test_stalled_body_is_408_in_the_envelope(
    proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    proxy = proxy_server(tokenizer="approx", body_timeout=1, upstream_metrics_interval=0)
    with open_socket(proxy.url, timeout=15) as sock:
        sock.sendall(chat_head(CHAT, len(BODY), "connection: close\r\n") + BODY[:10])
        answer = read_all(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    error = json.loads(body)["error"]
    assert error["code"] == "request_timeout"
    assert "TRIMPROXY_BODY_TIMEOUT" in error["message"]
    assert sim_upstream.requests() == []
    assert scrape(proxy.url).value("trimproxy_requests_total", route=CHAT, code="408") == 1


def test_stalled_uploads_do_not_take_in_flight_slots(
    proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    proxy = proxy_server(tokenizer="approx", max_in_flight=2, body_timeout=30)
    stalled = [open_socket(proxy.url, timeout=15) for _ in range(5)]
    try:
        for sock in stalled:
            sock.sendall(chat_head(CHAT, len(BODY)) + BODY[:10])
        # Every stalled request has reached the app: the proxy has read its head and
        # the start of its body, the rest never comes.
        for sock in stalled:
            wait_until_read(sock)
        assert scrape(proxy.url).value("trimproxy_requests_in_flight") == 0
        for _ in range(3):
            answer = httpx.post(proxy.url + CHAT, content=BODY, timeout=15)
            assert answer.status_code == 200, answer.text
    finally:
        for sock in stalled:
            sock.close()


def test_in_flight_gauge_does_not_count_the_scrape_itself(
    proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    proxy = proxy_server(tokenizer="approx")
    httpx.post(proxy.url + CHAT, content=BODY, timeout=15)
    assert scrape(proxy.url).value("trimproxy_requests_in_flight") == 0


def test_half_sent_headers_are_closed_after_the_header_timeout(
    proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    proxy = proxy_server(tokenizer="approx", header_timeout=1, idle_timeout=30)
    with open_socket(proxy.url, timeout=20) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\n")
        # The proxy closes the connection: recv returns b"" (it does not time out). The
        # socket's 20 s timeout is a hang guard, under the idle timeout (30 s), so only
        # the header timeout can have closed it.
        assert read_all(sock) == b""
    with open_socket(proxy.url, timeout=20) as sock:  # nothing sent at all
        assert read_all(sock) == b""


def test_the_header_timeout_holds_for_every_request_of_a_kept_alive_connection(
    proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    """Requests that come sooner than the timeout keep the connection; half-sent headers
    after them are closed within the timeout of the answer before (one timer, re-aimed
    at each request's deadline, not one per request)."""
    proxy = proxy_server(tokenizer="approx", header_timeout=1, idle_timeout=30)
    with open_socket(proxy.url, timeout=20) as sock:
        for _ in range(4):  # 2 s of requests in all: past the first deadline
            sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: proxy\r\n\r\n")
            answer = b""
            while not answer.endswith(b'{"status":"ok"}'):  # the head, then the body
                answer += sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200"), answer
            time.sleep(0.5)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: proxy\r\n")
        assert read_all(sock) == b""  # closed before the 20 s guard and the 30 s idle timeout


def test_idle_keep_alive_connections_are_closed(
    proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    proxy = proxy_server(tokenizer="approx", idle_timeout=1)
    with open_socket(proxy.url, timeout=20) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: proxy\r\n\r\n")
        answer = read_all(sock)  # the answer, then the close once idle
    assert answer.startswith(b"HTTP/1.1 200")


def test_client_leaving_mid_body_is_499_without_traceback(
    proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    proxy = proxy_server(tokenizer="approx")
    for _ in range(3):
        with open_socket(proxy.url, timeout=15) as sock:
            sock.sendall(chat_head(CHAT, len(BODY)) + BODY[:10])
            wait_until_read(sock)  # the request is in the app when its client leaves
    wait_for_scrape(
        proxy.url,
        lambda s: s.value("trimproxy_requests_total", route=CHAT, code="499") == 3,
    )
    logs = proxy.logs()
    lines = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    assert "Traceback" not in logs
    assert [line for line in lines if line.get("level") == "error"] == []
    assert scrape(proxy.url).value("trimproxy_requests_total", route=CHAT, code="500") == 0
    statuses = [line.get("status") for line in lines if line.get("path") == CHAT]
    assert statuses.count(499) == 3, lines


def test_oversized_headers_are_refused(proxy_server: StartProxy, sim_upstream: SimUpstream) -> None:
    """httptools has no header limit of its own; the proxy's protocol closes the
    connection (with a 431 when the client still reads) past TRIMPROXY_MAX_HEADER_BYTES."""
    proxy = proxy_server(tokenizer="approx", max_header_bytes=16384, header_timeout=120)
    answer = b""
    with open_socket(proxy.url, timeout=20) as sock:
        try:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: proxy\r\nx-big: ")
            for _ in range(64):  # 1 MiB in 16 KiB pieces, never finished
                sock.sendall(b"a" * 16384)
            answer = read_all(sock)
        except (ConnectionResetError, BrokenPipeError):
            pass  # closed while we were still sending
    assert answer == b"" or answer.startswith(b"HTTP/1.1 431"), answer[:200]
    # A normal request on a new connection still works.
    assert httpx.get(proxy.url + "/healthz", timeout=10).status_code == 200
