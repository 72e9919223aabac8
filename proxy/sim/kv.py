"""KV-cache accounting the way vLLM's paged allocator does it, without a GPU.

A running sequence holds ``ceil(tokens / block_size)`` blocks, where ``tokens`` is
its prompt plus what it has generated so far; it gives them all back when it ends,
or when its client goes away mid-generation (vLLM aborts such a request at once).
``usage`` is held blocks over all blocks: vLLM's ``kv_cache_usage_perc``.

Admission differs from vLLM in one way, to stay simple and deadlock-free: a request
starts only when the blocks for its *whole planned length* (prompt + completion) are
free, so the sim never preempts. Until then it waits in FIFO order and counts in
``num_requests_waiting``. A request larger than the whole cache runs alone.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field


@dataclass(eq=False)
class Sequence:
    """One running request's share of the cache."""

    prompt_tokens: int
    planned_blocks: int
    generated: int = 0
    held_blocks: int = 0
    done: bool = field(default=False, repr=False)


class KVCache:
    def __init__(self, total_blocks: int, block_size: int) -> None:
        self.total_blocks = total_blocks
        self.block_size = block_size
        self.used_blocks = 0
        self._reserved = 0
        self._running: set[Sequence] = set()
        self._waiters: deque[tuple[Sequence, asyncio.Future[None]]] = deque()

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    @property
    def usage(self) -> float:
        return min(1.0, self.used_blocks / self.total_blocks)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiters)

    def _plan(self, prompt_tokens: int, planned_new_tokens: int) -> Sequence:
        planned = min(self.blocks_for(prompt_tokens + planned_new_tokens), self.total_blocks)
        return Sequence(prompt_tokens=prompt_tokens, planned_blocks=planned)

    def try_admit(self, prompt_tokens: int, planned_new_tokens: int) -> Sequence | None:
        """Start the request now if it fits and nobody queues before it."""
        seq = self._plan(prompt_tokens, planned_new_tokens)
        if self._waiters or not self._fits(seq.planned_blocks):
            return None
        self._start(seq)
        return seq

    async def admit(self, prompt_tokens: int, planned_new_tokens: int) -> Sequence:
        """Wait until the request fits, then hold its prompt's blocks.

        Cancellation (the client left while queued) leaves nothing behind.
        """
        seq = self.try_admit(prompt_tokens, planned_new_tokens)
        if seq is not None:
            return seq
        seq = self._plan(prompt_tokens, planned_new_tokens)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (seq, future)
        self._waiters.append(entry)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():
                self.release(seq)  # started just as we were cancelled
            else:
                if entry in self._waiters:  # _wake may have dropped it already
                    self._waiters.remove(entry)
                self._wake()  # the head may have been blocking smaller requests
            raise
        return seq

    def _fits(self, planned: int) -> bool:
        return not self._running or self._reserved + planned <= self.total_blocks

    def _start(self, seq: Sequence) -> None:
        self._reserved += seq.planned_blocks
        self._running.add(seq)
        self.grow(seq, 0)

    def grow(self, seq: Sequence, generated: int) -> None:
        """Record that ``seq`` has now generated ``generated`` tokens in all."""
        if seq.done:
            return
        seq.generated = generated
        held = min(self.blocks_for(seq.prompt_tokens + generated), self.total_blocks)
        self.used_blocks += held - seq.held_blocks
        seq.held_blocks = held

    def release(self, seq: Sequence) -> None:
        if seq.done:
            return
        seq.done = True
        self.used_blocks -= seq.held_blocks
        seq.held_blocks = 0
        self._reserved -= seq.planned_blocks
        self._running.discard(seq)
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            seq, future = self._waiters[0]
            if future.done():  # cancelled; its waiter removes it, skip meanwhile
                self._waiters.popleft()
                continue
            if not self._fits(seq.planned_blocks):
                return
            self._waiters.popleft()
            self._start(seq)
            future.set_result(None)
