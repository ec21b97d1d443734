"""The paged KV cache's bookkeeping on the host (vLLM v1's vllm/v1/core/kv_cache_manager.py and
block_pool.py, reduced: no prefix caching, one KV cache group).

The model's KV cache is `num_blocks` physical blocks of `block_size` token slots each (the
model allocates them once: `setup_paged_cache(num_blocks, block_size)`). Each running
sequence owns a block table: the list of physical block ids holding its positions in order,
position p of the sequence living in slot `table[p // block_size] * block_size + p %
block_size` (its slot mapping). The manager hands blocks out of a free-block pool as
sequences grow and takes them back when they finish; a block is in at most one table at any
time (`check()` asserts it). Nothing here touches the GPU.

Not thread-safe by itself: the scheduler calls it under the engine's lock.
"""
from __future__ import annotations

from collections import deque
from typing import Hashable

from vkrt.errors import VkrtError

DEFAULT_BLOCK_SIZE = 16            # token slots per KV block
DEFAULT_KV_TOKENS_PER_SEQ = 2048   # the default cache: this many positions per sequence


def blocks_for(n_tokens: int, block_size: int) -> int:
    """Blocks that hold `n_tokens` token slots (ceil division)."""
    return -(-n_tokens // block_size)


class KVCacheManager:
    """A free-block pool and one block table per sequence.

    num_blocks: physical blocks in the model's cache (>= 1). block_size: token slots per
    block (>= 1). A sequence is a hashable object with `num_computed_tokens` (positions whose K/V
    are written already; the scheduler passes `vkrt.serve.request.Sequence`).
    Counters: `num_free_blocks`, `num_allocated_blocks` (= num_blocks - free),
    `num_allocations` / `num_frees` (blocks handed out / taken back since creation)."""

    def __init__(self, num_blocks: int, block_size: int):
        for name, v in (("block_size", block_size), ("num_blocks", num_blocks)):
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise VkrtError(f"the KV cache's {name} must be an integer >= 1, got {v!r}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._tables: dict[Hashable, list[int]] = {}
        self.num_allocations = 0
        self.num_frees = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_allocated_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def block_table(self, seq: Hashable) -> list[int]:
        """The physical block ids of `seq`, in position order (empty when it has none). The
        list is the manager's own: read it, do not change it."""
        return self._tables.get(seq, [])

    def blocks_needed(self, seq: Hashable, n_tokens: int) -> int:
        """Blocks `seq` still lacks to hold `n_tokens` positions in all (0 if it has them)."""
        return max(0, blocks_for(n_tokens, self.block_size) - len(self.block_table(seq)))

    def allocate_slots(self, seq, n_new_tokens: int) -> bool:
        """Make room for `n_new_tokens` more positions of `seq` after its
        `seq.num_computed_tokens` (positions num_computed .. num_computed + n_new - 1), taking
        blocks from the free pool. Returns False, and allocates nothing, when the pool has
        fewer blocks than that needs."""
        need = self.blocks_needed(seq, seq.num_computed_tokens + n_new_tokens)
        if need > len(self._free):
            return False
        if need:
            table = self._tables.setdefault(seq, [])
            for _ in range(need):
                table.append(self._free.popleft())
            self.num_allocations += need
        return True

    def slot(self, seq: Hashable, position: int) -> int:
        """The KV slot of `seq`'s `position`: table[position // block_size] * block_size +
        position % block_size. Raises VkrtError when no block holds that position."""
        table = self.block_table(seq)
        i = position // self.block_size
        if not 0 <= i < len(table):
            raise VkrtError(f"position {position} has no KV block ({len(table)} blocks of "
                            f"{self.block_size} allocated)")
        return table[i] * self.block_size + position % self.block_size

    def free(self, seq: Hashable) -> int:
        """Return every block of `seq` to the pool (its table is gone). Returns how many;
        a sequence without blocks frees 0."""
        table = self._tables.pop(seq, None)
        if not table:
            return 0
        # Freed blocks go to the front: the next allocation reuses the most recently freed
        # ones first (vLLM appends them to the back instead, to keep cached prefixes longer;
        # there is no prefix caching here), so a new sequence usually lands on another's
        # stale slots, the case a table or slot-mapping bug corrupts visibly.
        self._free.extendleft(reversed(table))
        self.num_frees += len(table)
        return len(table)

    def check(self) -> None:
        """Raise VkrtError unless every block is either free or in exactly one table, once."""
        seen: dict[int, object] = {}
        for seq, table in self._tables.items():
            for b in table:
                if b in seen:
                    raise VkrtError(f"KV block {b} is in two block tables")
                seen[b] = seq
        for b in self._free:
            if b in seen:
                raise VkrtError(f"KV block {b} is free and in a block table")
            seen[b] = None
        if sorted(seen) != list(range(self.num_blocks)):
            raise VkrtError(f"{self.num_blocks - len(seen)} KV blocks are lost (neither free "
                            "nor in a table)")
