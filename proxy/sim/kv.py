"""KV-cache scheduling the way vLLM's does it, without a GPU: admission, growth,
preemption, and the prefix cache's counters (the blocks are in ``blocks.py``).

A running sequence holds ``ceil(tokens / block_size)`` blocks, ``tokens`` being its
prompt plus what it has generated so far; the full blocks of its prompt it first
looks up in the prefix cache (never the block holding the last prompt token: vLLM
always recomputes at least one token to get logits). It gives its blocks back when
it ends or its client goes away (vLLM aborts such a request at once); they stay
cached until their space is needed. ``usage`` is held blocks over all blocks:
vLLM's ``kv_cache_usage_perc``.

Two admission policies (``SimConfig.preempt``):

* ``reserve`` (the default; the tests that count waiting requests rely on it): a
  request starts only when the blocks for its *whole planned length* (prompt +
  completion) are unreserved, so nothing is ever preempted. Simple and deadlock-free.
* ``preempt``: vLLM's own. A request starts when its prompt's blocks are free; a
  running sequence takes a block each time it fills one, and when none is free
  the newest running sequence is preempted (its blocks freed, itself queued at
  the front, recomputed when it is admitted again), counted in
  ``vllm:num_preemptions_total``.

Either way a request waits in FIFO order and counts in ``num_requests_waiting``;
a request larger than the whole cache runs alone.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

from proxy.sim.blocks import Block, BlockPool


@dataclass(eq=False)
class Sequence:
    """One request's share of the cache."""

    prompt_tokens: int
    planned_blocks: int
    hashes: Seq[int] = ()
    generated: int = 0
    blocks: list[Block] = field(default_factory=list, repr=False)
    #: Prompt tokens found in the prefix cache at the last admission.
    hit_tokens: int = 0
    preemptions: int = 0
    preempted: bool = False
    #: Preempted and not yet queued again (counts as waiting, as in vLLM).
    idle: bool = False
    done: bool = field(default=False, repr=False)

    @property
    def held_blocks(self) -> int:
        return len(self.blocks)


class KVCache:
    def __init__(self, total_blocks: int, block_size: int, *, preempt: bool = False) -> None:
        self.total_blocks = total_blocks
        self.block_size = block_size
        self.preempt = preempt
        self.pool = BlockPool(total_blocks)
        self._reserved = 0
        # Admission order, oldest first: the newest is the one preempted.
        self._running: dict[Sequence, None] = {}
        self._waiters: deque[tuple[Sequence, asyncio.Future[None]]] = deque()
        self._preempted_idle = 0
        self.reset_counters()

    def reset_counters(self) -> None:
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.preemptions = 0

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    @property
    def used_blocks(self) -> int:
        return self.pool.num_used

    @property
    def usage(self) -> float:
        return min(1.0, self.pool.num_used / self.total_blocks)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        # vLLM counts a preempted request as waiting until it is scheduled again.
        return len(self._waiters) + self._preempted_idle

    def _plan(self, prompt_tokens: int, planned_new_tokens: int, hashes: Seq[int]) -> Sequence:
        planned = min(self.blocks_for(prompt_tokens + planned_new_tokens), self.total_blocks)
        return Sequence(prompt_tokens=prompt_tokens, planned_blocks=planned, hashes=hashes)

    def try_admit(
        self, prompt_tokens: int, planned_new_tokens: int, hashes: Seq[int] = ()
    ) -> Sequence | None:
        """Start the request now if it fits and nobody queues before it."""
        seq = self._plan(prompt_tokens, planned_new_tokens, hashes)
        if self._waiters or not self._fits(seq):
            return None
        self._start(seq)
        return seq

    async def admit(
        self, prompt_tokens: int, planned_new_tokens: int, hashes: Seq[int] = ()
    ) -> Sequence:
        """Wait until the request fits, then hold its prompt's blocks.

        Cancellation (the client left while queued) leaves nothing behind.
        """
        seq = self.try_admit(prompt_tokens, planned_new_tokens, hashes)
        if seq is not None:
            return seq
        seq = self._plan(prompt_tokens, planned_new_tokens, hashes)
        await self._queue(seq, front=False)
        return seq

    async def readmit(self, seq: Sequence) -> None:
        """Queue a preempted sequence at the front until its blocks fit again."""
        if seq.idle:
            seq.idle = False
            self._preempted_idle -= 1
        await self._queue(seq, front=True)

    async def _queue(self, seq: Sequence, *, front: bool) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (seq, future)
        if front:
            self._waiters.appendleft(entry)
            self._wake()
        else:
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

    def _hit_blocks(self, seq: Sequence) -> list[Block]:
        tokens = seq.prompt_tokens + seq.generated
        # At least the last token is recomputed, so the block holding it never hits.
        cap = (tokens - 1) // self.block_size
        return self.pool.longest_hit(seq.hashes[:cap]) if seq.hashes else []

    def _needed(self, seq: Sequence) -> int:
        return min(self.blocks_for(seq.prompt_tokens + seq.generated), self.total_blocks)

    def _fits(self, seq: Sequence) -> bool:
        if not self._running:
            return True
        if not self.preempt:
            return self._reserved + seq.planned_blocks <= self.total_blocks
        fresh = self._needed(seq) - self.pool.in_use(self._hit_blocks(seq))
        return fresh <= self.pool.num_free

    def _start(self, seq: Sequence) -> None:
        hit = self._hit_blocks(seq)
        self.pool.touch(hit)
        seq.hit_tokens = len(hit) * self.block_size
        if seq.preemptions == 0:
            # vLLM counts a recomputed (preempted) request's lookups apart.
            self.prefix_queries += seq.prompt_tokens
            self.prefix_hits += seq.hit_tokens
        fresh = self._needed(seq) - len(hit)
        seq.blocks = hit + self.pool.allocate(min(fresh, self.pool.num_free))
        seq.preempted = False
        if seq.hashes:
            # vLLM names the blocks when it schedules them, before computing them.
            self.pool.cache(seq.blocks, seq.hashes)
        if not self.preempt:
            self._reserved += seq.planned_blocks
        self._running[seq] = None

    def grow(self, seq: Sequence, generated: int) -> bool:
        """Record that ``seq`` has now generated ``generated`` tokens in all; False
        when it was preempted (then ``await readmit(seq)`` before going on)."""
        if seq.done:
            return True
        if seq.preempted:
            return False
        seq.generated = generated
        missing = self._needed(seq) - len(seq.blocks)
        if missing <= 0:
            return True
        while missing > self.pool.num_free:
            if not self.preempt:  # cannot happen: reservations cover every block
                missing = self.pool.num_free
                break
            victim = next(reversed(self._running))
            self._preempt(victim)
            if victim is seq:
                return False
        seq.blocks += self.pool.allocate(missing)
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.preemptions += 1
        seq.preemptions += 1
        seq.preempted = True
        seq.idle = True
        self._preempted_idle += 1
        self._drop(seq)

    def _drop(self, seq: Sequence) -> None:
        self.pool.free(seq.blocks)
        seq.blocks = []
        if seq in self._running:
            del self._running[seq]
            if not self.preempt:
                self._reserved -= seq.planned_blocks
        self._wake()

    def release(self, seq: Sequence, tail_hashes: Seq[int] = ()) -> None:
        """The request ended. ``tail_hashes`` name the full blocks of its prompt and
        answer as the next turn of the conversation will render them, so that turn
        hits them as it would hit vLLM's cached decode blocks."""
        if seq.done:
            return
        seq.done = True
        if seq.idle:
            seq.idle = False
            self._preempted_idle -= 1
        if tail_hashes and seq.blocks:
            held = (seq.prompt_tokens + seq.generated) // self.block_size
            self.pool.cache(seq.blocks[:held], tail_hashes[:held])
        self._drop(seq)

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset()

    def _wake(self) -> None:
        while self._waiters:
            seq, future = self._waiters[0]
            if future.done():  # cancelled; its waiter removes it, skip meanwhile
                self._waiters.popleft()
                continue
            if not self._fits(seq):
                return
            self._waiters.popleft()
            self._start(seq)
            future.set_result(None)
