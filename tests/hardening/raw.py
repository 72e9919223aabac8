"""HTTP the way a hostile client sends it: paths byte for byte, bodies cut short.

httpx resolves dot segments in URLs before sending (``/v1/../metrics`` goes out as
``/metrics``), so the path tests talk through ``http.client``, which sends the
request target as given, or through a bare socket.
"""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error_code(self) -> str | None:
        try:
            code = self.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            return None
        return code if isinstance(code, str) else None


def request(
    base_url: str,
    method: str,
    target: str,
    body: bytes | dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> Answer:
    """One request with ``target`` sent verbatim; the whole answer read."""
    parts = urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    sent = {"content-type": "application/json", **(headers or {})}
    try:
        conn.request(method, target, body=data, headers=sent)
        response = conn.getresponse()
        payload = response.read()
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, payload)
    finally:
        conn.close()


def open_socket(base_url: str, timeout: float = 30.0) -> socket.socket:
    parts = urlsplit(base_url)
    return socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), timeout)


def read_all(sock: socket.socket) -> bytes:
    """Everything until the peer closes; the socket's timeout passing is an error
    (``TimeoutError``): the tests use it to prove that the proxy closed."""
    chunks = []
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def chat_head(path: str, length: int, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: proxy\r\ncontent-type: application/json\r\n"
        f"content-length: {length}\r\n{extra}\r\n"
    ).encode()
