"""The KV block pool with a prefix cache, the way vLLM V1's ``block_pool.py`` keeps it.

A full block of ``block_size`` tokens is named by a hash chained over every token
before it (``block_hashes``), so two prompts share a block only when they agree on
everything up to its end. A block holds a reference per running sequence using it;
at zero it joins the free queue but keeps its hash, so a later prompt with the same
prefix takes it back without recomputing. New blocks come off the front of the free
queue (the least recently freed), and taking a cached block from there evicts its
hash: that is vLLM's LRU eviction. A sequence frees its blocks last block first,
as vLLM does, so the tail of a conversation goes before its shared head.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class Block:
    __slots__ = ("block_hash", "index", "refs")

    def __init__(self, index: int) -> None:
        self.index = index
        self.refs = 0
        self.block_hash: int | None = None


def block_hashes(ids: Sequence[int], block_size: int) -> list[int]:
    """The chained hash of each full block of ``ids`` (a partial tail has none)."""
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(ids) - block_size + 1, block_size):
        # Tuples of ints hash the same in every process (no hash randomisation).
        parent = hash((parent, tuple(ids[start : start + block_size])))
        hashes.append(parent)
    return hashes


class BlockPool:
    def __init__(self, total_blocks: int) -> None:
        self.total_blocks = total_blocks
        # Insertion order is the eviction order: dicts keep it, and popping the first
        # key and deleting any key are O(1).
        self._free: dict[int, Block] = {i: Block(i) for i in range(total_blocks)}
        self._cached: dict[int, Block] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.total_blocks - len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def longest_hit(self, hashes: Sequence[int]) -> list[Block]:
        """The cached blocks of the longest run of ``hashes`` from the start."""
        hit: list[Block] = []
        cached = self._cached
        for block_hash in hashes:
            block = cached.get(block_hash)
            if block is None:
                break
            hit.append(block)
        return hit

    @staticmethod
    def in_use(blocks: Iterable[Block]) -> int:
        """How many of ``blocks`` other sequences hold (taking them costs no free block)."""
        return sum(1 for block in blocks if block.refs)

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take a reference on each of ``blocks`` (cache hits)."""
        for block in blocks:
            if block.refs == 0:
                del self._free[block.index]
            block.refs += 1

    def allocate(self, count: int) -> list[Block]:
        """``count`` fresh blocks, evicting the least recently freed cached ones."""
        if count > len(self._free):
            raise ValueError(f"{count} blocks asked, {len(self._free)} free")
        taken: list[Block] = []
        free = self._free
        for _ in range(count):
            block = free.pop(next(iter(free)))
            if block.block_hash is not None:
                if self._cached.get(block.block_hash) is block:
                    del self._cached[block.block_hash]
                block.block_hash = None
            block.refs = 1
            taken.append(block)
        return taken

    def cache(self, blocks: Sequence[Block], hashes: Sequence[int]) -> None:
        """Name ``blocks[i]`` by ``hashes[i]`` (full blocks just computed); a hash
        already cached keeps its first block, as vLLM keeps one copy."""
        cached = self._cached
        for block, block_hash in zip(blocks, hashes, strict=False):
            if block.block_hash is None and block_hash not in cached:
                block.block_hash = block_hash
                cached[block_hash] = block

    def free(self, blocks: Sequence[Block]) -> None:
        """Drop a reference on each block, the last first (it is evicted first)."""
        free = self._free
        for block in reversed(blocks):
            block.refs -= 1
            if block.refs == 0:
                free[block.index] = block

    def reset(self) -> bool:
        """Forget every cached hash (``POST /reset_prefix_cache``). Like vLLM, refuse
        while any block is in use: running sequences would lose their names."""
        if self.num_used:
            return False
        for block in self._cached.values():
            block.block_hash = None
        self._cached.clear()
        return True
