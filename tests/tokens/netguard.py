"""Make any attempt to open a network connection fail loudly, and remember it."""

from __future__ import annotations

import socket
from typing import Any

import pytest


class NetworkUsed(Exception):
    pass


def forbid_network(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    attempts: list[Any] = []

    def connect(self: socket.socket | None, address: Any) -> None:
        attempts.append(address)
        raise NetworkUsed(f"network access to {address!r}")

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect)
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: connect(None, a[:2]))
    return attempts
