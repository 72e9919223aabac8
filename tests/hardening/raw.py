"""HTTP the way a hostile client sends it: paths byte for byte, bodies cut short.

httpx resolves dot segments in URLs before sending (``/v1/../metrics`` goes out as
``/metrics``), so the path tests talk through ``http.client``, which sends the
request target as given, or through a bare socket.
"""

from __future__ import annotations

import http.client
import json
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

CHAT = "/v1/chat/completions"
#: A small chat request, for the tests where what it asks does not matter.
HELLO: dict[str, Any] = {
    "model": "bad-model",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 4,
}


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


def _proc_address(host: str, port: int) -> str:
    """An address as ``/proc/net/tcp`` and ``tcp6`` write it: each 32-bit word of the
    address in the kernel's byte order, in hex, then the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    raw = socket.inet_pton(family, host)
    words = struct.unpack(f"={len(raw) // 4}I", raw)
    return "".join(f"{word:08X}" for word in words) + f":{port:04X}"


def _queues(local: str, remote: str) -> tuple[int, int] | None:
    """``(tx_queue, rx_queue)`` of the established TCP socket from ``local`` to
    ``remote`` on this machine, or None where there is none."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[1] == local and fields[2] == remote and fields[3] == "01":
                    tx, rx = fields[4].split(":")
                    return int(tx, 16), int(rx, 16)
    return None


def wait_until_read(sock: socket.socket, timeout: float = 10.0) -> None:
    """Returns once the server on the other end of ``sock`` (a process on this
    machine) has read all that was sent on it: the client's side has nothing
    unacknowledged, the server's nothing unread. What a request's head brings about
    (the app's task for it) is then under way. Fails after ``timeout`` seconds (a
    hang guard, never a measure)."""
    client = _proc_address(*sock.getsockname()[:2])
    server = _proc_address(*sock.getpeername()[:2])
    deadline = time.monotonic() + timeout
    while True:
        sent, read = _queues(client, server), _queues(server, client)
        if sent is not None and read is not None and sent[0] == 0 and read[1] == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not read within {timeout}s: client {sent}, server {read}")
        time.sleep(0.01)


def chat_head(path: str, length: int, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: proxy\r\ncontent-type: application/json\r\n"
        f"content-length: {length}\r\n{extra}\r\n"
    ).encode()
