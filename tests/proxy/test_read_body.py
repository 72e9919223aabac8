"""``pipeline.read.read_body``: its own timer, told apart from anyone else's cancellation.

The end-to-end 408 of a client that stalls mid-body is
``tests/hardening/test_stalled_clients.py``; these pin what that rests on.
"""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request
from starlette.types import Message

from proxy.errors import ClientClosedRequest, RequestTimeout, RequestTooLarge
from proxy.pipeline.read import read_body


def _request(messages: list[Message], *, then_wait: bool = True) -> Request:
    """A request whose body comes as ``messages``; after them, ``receive`` waits for
    good (a client that stopped sending) or, with ``then_wait=False``, disconnects."""
    queue = list(messages)

    async def receive() -> Message:
        if queue:
            return queue.pop(0)
        if then_wait:
            await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
    return Request(scope, receive)


async def test_the_body_in_parts_comes_back_whole() -> None:
    parts: list[Message] = [
        {"type": "http.request", "body": b'{"a": ', "more_body": True},
        {"type": "http.request", "body": b"", "more_body": True},
        {"type": "http.request", "body": b"1}", "more_body": False},
    ]
    assert await read_body(_request(parts), limit=100, timeout=5) == b'{"a": 1}'


async def test_a_stalled_body_is_a_408_once_the_timeout_passes() -> None:
    stalled = _request([{"type": "http.request", "body": b"{", "more_body": True}])
    with pytest.raises(RequestTimeout) as caught:
        await read_body(stalled, limit=100, timeout=0.05)
    assert "TRIMPROXY_BODY_TIMEOUT" in caught.value.message
    # The timer's cancellation is taken back: the task goes on (to answer the 408).
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_someone_elses_cancellation_is_not_turned_into_a_408() -> None:
    stalled = _request([{"type": "http.request", "body": b"{", "more_body": True}])
    reading = asyncio.create_task(read_body(stalled, limit=100, timeout=30))
    await asyncio.sleep(0.01)
    reading.cancel()  # a shutdown, say
    with pytest.raises(asyncio.CancelledError):
        await reading


async def test_a_client_that_leaves_mid_body_is_a_499() -> None:
    leaving = _request([{"type": "http.request", "body": b"{", "more_body": True}], then_wait=False)
    with pytest.raises(ClientClosedRequest):
        await read_body(leaving, limit=100, timeout=5)


async def test_a_body_over_the_limit_is_a_413_as_soon_as_it_is() -> None:
    parts: list[Message] = [
        {"type": "http.request", "body": b"x" * 60, "more_body": True},
        {"type": "http.request", "body": b"x" * 60, "more_body": True},
    ]
    with pytest.raises(RequestTooLarge):
        await read_body(_request(parts), limit=100, timeout=5)
