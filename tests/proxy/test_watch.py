"""The disconnect watcher (``proxy.pipeline.relay.watch_disconnect``): late start (at once for
streams), cheap cancel.

The end-to-end guarantee (a client that leaves frees the upstream within 1.5 s) is
``test_streaming.test_client_disconnect_closes_the_upstream_at_once``; these pin the
helper's own contract, which that guarantee rests on.
"""

from __future__ import annotations

import asyncio

import pytest
from starlette.types import Message, Receive

from proxy import routes
from proxy.pipeline import handler
from proxy.pipeline.relay import WATCH_DELAY, watch_disconnect
from tests.support.inprocess import StartApp
from tests.support.sim import SimUpstream


class FakeReceive:
    """An ASGI ``receive`` fed by the test; counts the calls."""

    def __init__(self) -> None:
        self.messages: asyncio.Queue[Message | Exception] = asyncio.Queue()
        self.calls = 0

    async def __call__(self) -> Message:
        self.calls += 1
        item = await self.messages.get()
        if isinstance(item, Exception):
            raise item
        return item


async def test_a_disconnect_completes_the_future() -> None:
    receive = FakeReceive()
    gone = watch_disconnect(receive, delay=0)
    receive.messages.put_nowait({"type": "http.request", "body": b"", "more_body": False})
    receive.messages.put_nowait({"type": "http.disconnect"})
    await asyncio.wait_for(gone, timeout=30)
    assert gone.result() is None
    assert receive.calls == 2


async def test_a_watch_cancelled_before_its_delay_never_calls_receive() -> None:
    receive = FakeReceive()
    gone = watch_disconnect(receive, delay=60)
    gone.cancel()
    for _ in range(5):
        await asyncio.sleep(0)
    assert gone.cancelled()
    assert receive.calls == 0


async def test_a_receive_that_fails_counts_as_gone() -> None:
    receive = FakeReceive()
    gone = watch_disconnect(receive, delay=0)
    receive.messages.put_nowait(RuntimeError("the server dropped the connection"))
    await asyncio.wait_for(gone, timeout=30)
    assert gone.result() is None


async def test_cancelling_a_started_watch_stops_its_task() -> None:
    receive = FakeReceive()
    gone = watch_disconnect(receive, delay=0)
    while receive.calls == 0:  # the watcher is waiting in receive()
        await asyncio.sleep(0)
    watchers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    gone.cancel()
    for _ in range(5):
        await asyncio.sleep(0)
    assert all(t.done() for t in watchers)


@pytest.mark.parametrize(
    ("path", "stream", "delay"),
    [
        ("/v1/chat/completions", True, 0.0),
        ("/v1/chat/completions", False, 0.25),
        ("/v1/completions", True, 0.0),  # the dialect's parse reads it
        ("/v1/completions", None, 0.25),
        ("/v1/embeddings", True, 0.0),  # passed through, not parsed
        ("/v1/embeddings", None, 0.25),
    ],
)
async def test_a_stream_is_watched_from_the_start_a_plain_answer_later(
    app_proxy: StartApp,
    sim_upstream: SimUpstream,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    stream: bool | None,
    delay: float,
) -> None:
    # Streams last and are where clients leave midway; a plain answer behind a fast
    # engine is usually over before it would be worth watching.
    delays: list[float] = []

    def recording(receive: Receive, delay: float = WATCH_DELAY) -> asyncio.Future[None]:
        delays.append(delay)
        return watch_disconnect(receive, delay)

    monkeypatch.setattr(handler, "watch_disconnect", recording)
    monkeypatch.setattr(routes, "watch_disconnect", recording)
    proxy = await app_proxy(tokenizer="approx")
    body: dict[str, object] = {"model": "sim-model", "max_tokens": 4}
    if path == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": "hello"}]
    elif path == "/v1/completions":
        body["prompt"] = "hello"
    else:
        body["input"] = "hello"
    if stream is not None:
        body["stream"] = stream
    response = await proxy.client.post(path, json=body)
    assert response.status_code == 200, response.text
    assert delays == [delay]
