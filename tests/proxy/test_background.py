"""``proxy.background.Background``: start, stop, again, and a loop that fails."""

from __future__ import annotations

import asyncio
import logging

import pytest

from proxy.background import Background

log = logging.getLogger("trimproxy.test-background")


class Loop:
    """A background loop that records its runs and ends, parked on an event."""

    def __init__(self) -> None:
        self.started = 0
        self.cancelled = 0
        self.go_on = asyncio.Event()

    async def __call__(self) -> None:
        self.started += 1
        try:
            await self.go_on.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


def task_named(name: str) -> asyncio.Task[object]:
    (task,) = [t for t in asyncio.all_tasks() if t.get_name() == name]
    return task


async def test_start_names_the_task_and_is_idempotent() -> None:
    loop = Loop()
    background = Background("trimproxy-test-loop", loop, log)
    assert not background.running
    background.start()
    background.start()
    await asyncio.sleep(0)  # the task's first step
    assert background.running
    assert loop.started == 1
    task_named("trimproxy-test-loop")  # one task, under that name
    await background.stop()


async def test_stop_cancels_waits_and_may_be_called_again() -> None:
    loop = Loop()
    background = Background("trimproxy-test-loop", loop, log)
    await background.stop()  # never started: nothing to do
    background.start()
    await asyncio.sleep(0)
    task = task_named("trimproxy-test-loop")
    await background.stop()
    assert task.cancelled()  # ended, not merely asked to
    assert (loop.started, loop.cancelled) == (1, 1)
    assert not background.running
    await background.stop()
    background.start()  # a stopped loop starts afresh
    await asyncio.sleep(0)
    assert loop.started == 2
    await background.stop()
    assert loop.cancelled == 2


async def test_a_loop_that_fails_is_logged_when_it_ends_and_may_start_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs = 0

    async def broken() -> None:
        nonlocal runs
        runs += 1
        raise RuntimeError("a bug in the loop")

    caplog.set_level(logging.ERROR, logger=log.name)
    background = Background("trimproxy-test-broken", broken, log)
    background.start()
    await asyncio.wait([task_named("trimproxy-test-broken")])
    # Said when it ended, before anyone stopped it, with the traceback.
    (record,) = [r for r in caplog.records if r.name == log.name]
    assert record.getMessage() == "trimproxy-test-broken ended unexpectedly"
    assert record.exc_info is not None and "a bug in the loop" in str(record.exc_info[1])
    assert not background.running
    background.start()
    await asyncio.wait([task_named("trimproxy-test-broken")])
    assert runs == 2
    await background.stop()  # a task that already ended: nothing raised
    assert len([r for r in caplog.records if r.name == log.name]) == 2


async def test_a_loop_that_returns_is_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    async def once() -> None:
        return None

    caplog.set_level(logging.DEBUG, logger=log.name)
    background = Background("trimproxy-test-once", once, log)
    background.start()
    await asyncio.wait([task_named("trimproxy-test-once")])
    await background.stop()
    assert [r for r in caplog.records if r.name == log.name] == []


async def test_cancelling_stop_itself_is_not_swallowed() -> None:
    cleaned = asyncio.Event()
    finish = asyncio.Event()

    async def slow_to_end() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.set()
            await finish.wait()  # its cleanup takes a while

    background = Background("trimproxy-test-slow", slow_to_end, log)
    background.start()
    await asyncio.sleep(0)
    stopping = asyncio.create_task(background.stop())
    await cleaned.wait()  # the loop was cancelled and is cleaning up
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    task = task_named("trimproxy-test-slow")
    assert not task.done()  # left to end on its own
    finish.set()
    await asyncio.wait([task])
    assert task.cancelled()
