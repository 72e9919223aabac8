"""The sim's block pool and prefix cache (``proxy.sim.blocks``, ``proxy.sim.kv``) as
units: chained hashes, the longest cached run, the last-token rule, LRU eviction,
preemption of the newest sequence."""

from __future__ import annotations

import asyncio

from proxy.sim.blocks import BlockPool, block_hashes
from proxy.sim.kv import KVCache

BS = 4


def ids(n: int, start: int = 100) -> list[int]:
    return list(range(start, start + n))


def test_hashes_chain_over_every_token_before_the_block() -> None:
    a = block_hashes(ids(12), BS)
    assert len(a) == 3  # full blocks only
    assert block_hashes(ids(14), BS) == a  # a partial tail adds none
    changed = ids(12)
    changed[0] = 7  # the first token differs: every later block differs too
    b = block_hashes(changed, BS)
    assert all(x != y for x, y in zip(a, b, strict=True))
    # The same block content after a different prefix is another block.
    assert block_hashes(ids(4, 104), BS)[0] != a[1]


def test_a_second_request_hits_all_but_the_block_of_its_last_token() -> None:
    kv = KVCache(64, BS)
    prompt = ids(16)  # four full blocks
    first = kv.try_admit(16, 0, block_hashes(prompt, BS))
    assert first is not None and first.hit_tokens == 0
    kv.release(first)
    second = kv.try_admit(16, 0, block_hashes(prompt, BS))
    assert second is not None
    # vLLM recomputes the last prompt token, so the block holding it is computed again.
    assert second.hit_tokens == 12
    assert (kv.prefix_queries, kv.prefix_hits) == (32, 12)
    kv.release(second)
    longer = kv.try_admit(18, 0, block_hashes(ids(18), BS))
    assert longer is not None and longer.hit_tokens == 16
    kv.release(longer)


def test_a_cache_too_small_for_all_conversations_evicts_the_least_recently_used() -> None:
    kv = KVCache(8, BS)  # room for two 4-block prompts
    convs = {name: ids(16, start) for name, start in (("a", 1000), ("b", 2000), ("c", 3000))}

    def run(name: str) -> int:
        seq = kv.try_admit(16, 0, block_hashes(convs[name], BS))
        assert seq is not None
        kv.release(seq)
        return seq.hit_tokens

    assert run("a") == 0 and run("b") == 0
    assert run("a") == 12  # a is now the most recently used
    assert run("c") == 0  # needs four blocks: b's, the least recently used, go
    assert run("a") == 12
    assert run("b") == 0


def test_a_sequence_frees_its_tail_first() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(4)
    pool.cache(blocks, [11, 12, 13, 14])
    pool.free(blocks)
    # The next allocation evicts the last block of the freed sequence, not its head.
    taken = pool.allocate(1)
    assert taken[0] is blocks[3]
    assert [b.index for b in pool.longest_hit([11, 12, 13, 14])] == [0, 1, 2]


def test_reset_is_refused_while_blocks_are_held() -> None:
    kv = KVCache(16, BS)
    seq = kv.try_admit(8, 0, block_hashes(ids(8), BS))
    assert seq is not None
    assert kv.reset_prefix_cache() is False
    kv.release(seq)
    assert kv.pool.num_cached == 2
    assert kv.reset_prefix_cache() is True
    again = kv.try_admit(8, 0, block_hashes(ids(8), BS))
    assert again is not None and again.hit_tokens == 0


def test_shared_blocks_stay_until_the_last_user_leaves() -> None:
    kv = KVCache(16, BS)
    hashes = block_hashes(ids(12), BS)
    one = kv.try_admit(12, 0, hashes)
    two = kv.try_admit(12, 0, hashes)
    assert one is not None and two is not None
    assert two.hit_tokens == 8
    assert kv.used_blocks == 3 + 1  # two's last block is its own
    kv.release(one)
    assert kv.used_blocks == 3  # two still holds the shared head
    kv.release(two)
    assert kv.used_blocks == 0


async def test_preempt_frees_the_newest_and_it_resumes_when_blocks_come_back() -> None:
    kv = KVCache(6, BS, preempt=True)
    old = kv.try_admit(8, 16, ())  # two blocks now, grows to six
    new = kv.try_admit(8, 16, ())
    assert old is not None and new is not None
    assert kv.used_blocks == 4
    assert kv.grow(old, 4)  # 12 tokens: a third block
    assert kv.grow(old, 8)  # 16 tokens: a fourth; all six are used
    assert kv.used_blocks == 6
    assert kv.grow(old, 12)  # 20 tokens: none free, so the newest (new) is preempted
    assert kv.preemptions == 1 and new.preempted and new.held_blocks == 0
    assert kv.num_running == 1 and kv.num_waiting == 1
    assert not kv.grow(new, 1)  # new learns it was preempted
    resumed = asyncio.ensure_future(kv.readmit(new))
    await asyncio.sleep(0)
    assert not resumed.done()  # old holds five blocks; new needs two of one free
    kv.release(old)
    await asyncio.wait_for(resumed, 1)
    assert kv.num_running == 1 and kv.num_waiting == 0
    assert new.held_blocks == 2 and new.preemptions == 1
    kv.release(new)
    assert kv.used_blocks == 0
    # Recomputation is not a new query: vLLM counts preempted requests' lookups apart.
    assert kv.prefix_queries == 16
