"""The paged KV cache's bookkeeping on the host (vLLM v1's vllm/v1/core/kv_cache_manager.py and
block_pool.py, reduced: one KV cache group).

The model's KV cache is `num_blocks` physical blocks of `block_size` token slots each (the
model allocates them once: `setup_paged_cache(num_blocks, block_size)`). Each running
sequence owns a block table: the list of physical block ids holding its positions in order,
position p of the sequence living in slot `table[p // block_size] * block_size + p %
block_size` (its slot mapping). The manager hands blocks out of a free-block pool as
sequences grow and takes them back when they finish. Nothing here touches the GPU.

Prefix caching (vLLM's automatic prefix caching; `prefix_caching=True`): a full block of a
sequence's prompt is cached under its key, (the key of the block before it, its block_size
token ids), once the step that computes its last position is scheduled (`cache_blocks`).
A sequence admitted later whose prompt starts with the same tokens takes those blocks into
its own table (`cached_prefix`, `allocate_slots(..., cached=)`) and computes only the rest:
a block then sits in several tables, counted by its reference count, and is never written
again (every position in it is computed). Only blocks inside the prompt are cached: a
generated token's products run on another kernel than a prompt token's (the batched runner's
roles, vkrt/models/batch.py), so a block that holds one would not be the bits a later prompt
computes; a prompt block's K and V are (a token's row is computed in an order fixed by the row
alone, attention in an order fixed by its position), so a sequence gets the same bits with
or without a hit. Keys chain exactly (no hash collisions): a key names its parent by an id
handed out when the parent was cached, and an evicted key's id is never given again. A block
whose last table lets go of it returns to the pool still cached, behind the uncached free
blocks (evicted last, least recently freed first); it is evicted (its key forgotten) when
the pool hands it out again. `reset_prefix_cache` forgets every key (a step failed: the
blocks it was to fill hold nothing).

Not thread-safe by itself: the scheduler calls it under the engine's lock.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Hashable

from vkrt.errors import VkrtError

DEFAULT_BLOCK_SIZE = 16            # token slots per KV block
DEFAULT_KV_TOKENS_PER_SEQ = 2048   # the default cache: this many positions per sequence

ROOT = 0                           # the parent id of a sequence's first block


def blocks_for(n_tokens: int, block_size: int) -> int:
    """Blocks that hold `n_tokens` token slots (ceil division)."""
    return -(-n_tokens // block_size)


class KVCacheManager:
    """A free-block pool, one block table per sequence and, with `prefix_caching`, the
    cached prompt blocks.

    num_blocks: physical blocks in the model's cache (>= 1). block_size: token slots per
    block (>= 1). A sequence is a hashable object with `num_computed_tokens` (positions whose K/V
    are written already), `token_ids` and `num_prompt_tokens` (the scheduler passes
    `vkrt.serve.request.Sequence`).
    Counters: `num_free_blocks` (cached ones no table holds included: the pool evicts them),
    `num_allocated_blocks` (= num_blocks - free), `num_cached_blocks` (blocks under a key),
    `num_allocations` / `num_frees` (blocks out of / back into the pool since creation, a
    cached block a table takes from the pool counted as allocated), `num_hit_tokens` (prompt positions
    sequences took from the cache instead of computing them) and `num_evictions`."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True):
        for name, v in (("block_size", block_size), ("num_blocks", num_blocks)):
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise VkrtError(f"the KV cache's {name} must be an integer >= 1, got {v!r}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.prefix_caching = bool(prefix_caching)
        # The pool, in the order it hands blocks out: uncached blocks freed before (the most
        # recently freed first), then the never used ones (`_fresh` .. num_blocks - 1, in
        # order), then cached ones, least recently freed first. Only blocks used so far
        # have entries, so a manager of any size costs nothing until its blocks are used.
        self._free: OrderedDict[int, None] = OrderedDict()      # uncached
        self._fresh = 0
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self._tables: dict[Hashable, list[int]] = {}
        self._refs: dict[int, int] = {}               # tables holding each block in one
        self._key_of: dict[int, tuple] = {}           # cached block -> its key
        self._cached: dict[tuple, tuple[int, int]] = {}   # key -> (block, the key's id)
        self._next_id = ROOT + 1
        # Per sequence: its prompt blocks `cache_blocks` walked so far, the last one's key id.
        self._walked: dict[Hashable, tuple[int, int]] = {}
        self.num_allocations = self.num_frees = 0
        self.num_hit_tokens = self.num_evictions = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + self.num_blocks - self._fresh + len(self._free_cached)

    @property
    def num_allocated_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._key_of)

    def block_table(self, seq: Hashable) -> list[int]:
        """The physical block ids of `seq`, in position order (empty when it has none). The
        list is the manager's own: read it, do not change it."""
        return self._tables.get(seq, [])

    def blocks_needed(self, seq: Hashable, n_tokens: int) -> int:
        """Blocks `seq` still lacks to hold `n_tokens` positions in all (0 if it has them)."""
        return max(0, blocks_for(n_tokens, self.block_size) - len(self.block_table(seq)))

    # -- prefix caching --------------------------------------------------------------------

    def _keys(self, seq, n_blocks: int, start: int = 0, parent: int = ROOT):
        """(block index, key) of `seq`'s prompt blocks `start` .. n_blocks - 1, in order,
        while each one's parent is cached (a key chains through its parent's id; `parent`:
        block start - 1's)."""
        bs = self.block_size
        for j in range(start, n_blocks):
            key = (parent, tuple(seq.token_ids[j * bs:(j + 1) * bs]))
            yield j, key
            hit = self._cached.get(key)
            if hit is None:
                return
            parent = hit[1]

    def cached_prefix(self, seq) -> list[int]:
        """The cached blocks that hold `seq`'s longest cached prompt prefix, in order: full
        prompt blocks only, and never its last token's (a step must compute at least one
        token to sample from). [] when prefix caching is off or `seq` has a table."""
        if not self.prefix_caching or seq in self._tables:
            return []
        n = min(seq.num_prompt_tokens, len(seq.token_ids) - 1) // self.block_size
        blocks = []
        for _, key in self._keys(seq, n):
            hit = self._cached.get(key)
            if hit is None:
                break
            blocks.append(hit[0])
        return blocks

    def cache_blocks(self, seq, n_tokens: int) -> None:
        """`seq`'s first `n_tokens` positions are computed (or scheduled in the step being
        built): cache each full prompt block among them not cached yet. A key cached
        already (another sequence's block of the same tokens) keeps its block."""
        if not self.prefix_caching:
            return
        table = self._tables.get(seq, [])
        n = min(n_tokens, seq.num_prompt_tokens, len(table) * self.block_size) // self.block_size
        done, parent = self._walked.get(seq, (0, ROOT))
        for j, key in self._keys(seq, n, done, parent):
            if key not in self._cached and table[j] not in self._key_of:
                self._cached[key] = (table[j], self._next_id)
                self._key_of[table[j]] = key
                self._next_id += 1
            hit = self._cached.get(key)
            if hit is None:
                break
            # Every step calls this for every running sequence: walk each block once.
            self._walked[seq] = (j + 1, hit[1])

    def reset_prefix_cache(self) -> None:
        """Forget every key (blocks stay in their tables; free ones join the uncached)."""
        self._cached.clear()
        self._key_of.clear()
        self._walked.clear()
        self._free.update(self._free_cached)
        self._free_cached.clear()

    def _take_free(self) -> int:
        """The pool's next block, evicted from the cache if it was cached."""
        if self._free:
            return self._free.popitem(last=False)[0]
        if self._fresh < self.num_blocks:
            self._fresh += 1
            return self._fresh - 1
        block, _ = self._free_cached.popitem(last=False)
        key = self._key_of.pop(block, None)
        if key is not None:
            del self._cached[key]
            self.num_evictions += 1
        return block

    # -- tables ----------------------------------------------------------------------------

    def allocate_slots(self, seq, n_new_tokens: int, cached: list[int] = ()) -> bool:
        """Make room for `n_new_tokens` more positions of `seq` after its
        `seq.num_computed_tokens` (positions num_computed .. num_computed + n_new - 1), taking
        blocks from the free pool. `cached`: the blocks of `cached_prefix(seq)` (`seq` has no
        table yet), taken first as its table's start: the new positions then follow them
        (len(cached) * block_size .., whatever `seq.num_computed_tokens` says; the caller
        sets it once this returns True). Returns False, and takes nothing, when the pool has
        fewer blocks than that needs (a cached block no table holds counts as one of them)."""
        start = seq.num_computed_tokens
        if cached:
            assert seq not in self._tables, "cached blocks start a table"
            start = len(cached) * self.block_size
        have = len(self.block_table(seq)) + len(cached)
        need = max(0, blocks_for(start + n_new_tokens, self.block_size) - have)
        idle = sum(1 for b in cached if not self._refs.get(b))
        if need + idle > self.num_free_blocks:
            return False
        table = self._tables.setdefault(seq, []) if need or cached else None
        for b in cached:
            if not self._refs.get(b):
                del self._free_cached[b]
            self._refs[b] = self._refs.get(b, 0) + 1
            table.append(b)
        self.num_hit_tokens += len(cached) * self.block_size
        for _ in range(need):
            b = self._take_free()
            self._refs[b] = 1
            table.append(b)
        self.num_allocations += need + idle
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
        """Let go of every block of `seq` (its table is gone): a block no other table holds
        returns to the pool. Returns how many blocks the table held; a sequence without
        blocks frees 0."""
        table = self._tables.pop(seq, None)
        self._walked.pop(seq, None)
        if not table:
            return 0
        # Uncached blocks go to the front: the next allocation reuses the most recently
        # freed ones first, so a new sequence usually lands on another's stale slots, the
        # case a table or slot-mapping bug corrupts visibly. Cached ones go to the back,
        # the table's last block first (vLLM's order: a prefix's tail is evicted before its
        # head, which more prompts share).
        for b in reversed(table):
            self._refs[b] -= 1
            if self._refs[b]:
                continue
            del self._refs[b]
            self.num_frees += 1
            if b in self._key_of:
                self._free_cached[b] = None
            else:
                self._free[b] = None
                self._free.move_to_end(b, last=False)
        return len(table)

    def check(self) -> None:
        """Raise VkrtError unless every block is either free or held by as many tables as
        its reference count (at most once per table), and the cache's two maps agree."""
        held: dict[int, int] = {}
        for seq, table in self._tables.items():
            if len(set(table)) != len(table):
                raise VkrtError(f"a block table holds a KV block twice: {table}")
            for b in table:
                held[b] = held.get(b, 0) + 1
        for b, n in held.items():
            if self._refs.get(b) != n:
                raise VkrtError(f"KV block {b} is in {n} block tables, counted "
                                f"{self._refs.get(b, 0)}")
            if b in self._free or b in self._free_cached or b >= self._fresh:
                raise VkrtError(f"KV block {b} is free and in a block table")
        if set(self._refs) != set(held):
            raise VkrtError("a KV block is counted as held by no block table")
        if set(self._free) & set(self._free_cached) or any(
                b >= self._fresh for b in (*self._free, *self._free_cached)):
            raise VkrtError("a KV block is free twice")
        if any(b not in self._key_of for b in self._free_cached):
            raise VkrtError("an uncached KV block waits among the cached ones")
        lost = self.num_blocks - len(held) - self.num_free_blocks
        if lost:
            raise VkrtError(f"{lost} KV blocks are lost (neither free nor in a table)")
        for key, (b, _) in self._cached.items():
            if self._key_of.get(b) != key:
                raise VkrtError(f"KV block {b}'s cache entry is inconsistent")
