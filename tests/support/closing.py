"""The type of the ``closing`` fixture (tests/conftest.py): it enters a client (an
SDK client, an ``httpx.Client``, a socket) and hands it back, and closes it when the
test ends, so that no connection is left for the garbage collector to finalise in
whatever test runs then (a ``ResourceWarning``, an error under ``filterwarnings``)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Protocol, TypeVar

T = TypeVar("T")


class Closing(Protocol):
    def __call__(self, client: AbstractContextManager[T], /) -> T: ...


class AsyncClosing(Protocol):
    async def __call__(self, client: AbstractAsyncContextManager[T], /) -> T: ...
