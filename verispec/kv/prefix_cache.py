"""PrefixCache: full KV blocks indexed by their tokens and the block before them, so a request
whose prompt starts with tokens another request already computed reuses their KV blocks.

A block is indexed once every position in it is computed; from then on nobody writes to it
(a request writes only at and after its num_computed_tokens, rollback never reaches a computed
position), so sharing it by reference count is safe. Keys are exact, (parent block id, the
block's token ids), with -1 for the first block: a match walks block by block from the start,
so a hit is the same tokens at the same positions after the same prefix. A block whose last
owner frees it stays indexed and readable (evictable) until the allocator needs it for new
data (least recently freed first), when the index forgets it and every block keyed under it.

Worked example, block_size=2: request A computes [5, 6, 7, 8, 9]; its blocks 0 ([5, 6]) and 1
([7, 8]) are indexed as (-1, (5, 6)) -> 0 and (0, (7, 8)) -> 1. Request B with prompt
[5, 6, 7, 8, 3] matches both (at most (5 - 1) // 2 = 2 blocks: its last token must still be
computed to give logits) and starts at position 4.

A drafter's cache whose block content depends on tokens past the block (an EAGLE head's row r
reads token r + 1) keys each block with `lookahead` more tokens: with lookahead=1 above, A's
head block 0 is keyed (-1, (5, 6, 7)); B matches it too, as its token 2 is also 7.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from verispec.kv.block_allocator import BlockAllocator
from verispec.kv.block_table import BlockTable

__all__ = ["STOP", "PrefixCache"]

Key = tuple[int, tuple[int, ...]]
STOP = -1
"""num_indexed of a table whose further blocks are not indexed (see PrefixCache.insert)."""


class PrefixCache:
    """The index of one KV cache's full blocks, and its hit counters (in tokens)."""

    def __init__(self, allocator: BlockAllocator, block_size: int, lookahead: int = 0) -> None:
        if lookahead not in (0, 1):
            raise ValueError(f"lookahead must be 0 or 1, got {lookahead!r}")
        self.allocator = allocator
        self.block_size = block_size
        self.lookahead = lookahead
        """Tokens after a block that its content depends on, and its key holds."""
        allocator.on_evict = self._forget
        self._blocks: dict[Key, int] = {}
        self._key_of: dict[int, Key] = {}
        self._children: dict[int, set[int]] = defaultdict(set)
        self.num_queries = 0
        """Prompt tokens looked up (one lookup per admitted request)."""
        self.num_hits = 0
        """Of those, tokens whose KV was found."""

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, token_ids: Sequence[int], max_blocks: int | None = None) -> list[int]:
        """The cached blocks holding token_ids' longest indexed prefix of full blocks (at most
        max_blocks), leaving at least the last token to compute; each gets an owner (the
        caller's table)."""
        blocks = self.peek(token_ids, max_blocks)
        for block in blocks:
            self.allocator.revive(block)
        return blocks

    def peek(self, token_ids: Sequence[int], max_blocks: int | None = None) -> list[int]:
        """The blocks match would return, without taking them."""
        size, extra = self.block_size, self.lookahead
        blocks: list[int] = []
        parent = -1
        num = (len(token_ids) - 1) // size
        for i in range(num if max_blocks is None else min(num, max_blocks)):
            block = self._blocks.get((parent, tuple(token_ids[i * size : (i + 1) * size + extra])))
            if block is None:
                break
            blocks.append(block)
            parent = block
        return blocks

    def record(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count one lookup of num_tokens of which num_hit_tokens were found."""
        self.num_queries += num_tokens
        self.num_hits += num_hit_tokens

    def insert(
        self, table: BlockTable, token_ids: Sequence[int], num_indexed: int, num_computed: int
    ) -> int:
        """Index the table's full blocks after its first num_indexed (which are indexed: matched
        or inserted before) whose positions are all computed. Returns the new num_indexed, or
        STOP when a block's content is already indexed under another block (two requests
        computed the same prefix at once): that table's later blocks are not indexed, so every
        indexed block's parent is owned by whoever owns the block and cannot be evicted first."""
        if num_indexed == STOP:
            return STOP
        size, extra = self.block_size, self.lookahead
        full = min(num_computed // size, len(table.blocks), (len(token_ids) - extra) // size)
        parent = table.blocks[num_indexed - 1] if num_indexed else -1
        for i in range(num_indexed, full):
            block = table.blocks[i]
            key = (parent, tuple(token_ids[i * size : (i + 1) * size + extra]))
            if key in self._blocks:
                return STOP
            self._blocks[key] = block
            self._key_of[block] = key
            self._children[parent].add(block)
            self.allocator.mark_cached(block)
            parent = block
        return max(full, num_indexed)

    def reset(self) -> None:
        """Forget every indexed block (vLLM's reset_prefix_cache): an unowned one becomes plainly
        free, an owned one stays its owner's but is no longer shared. The hit counters stay."""
        for block in list(self._key_of):
            self.allocator.uncache(block)
        self._blocks.clear()
        self._key_of.clear()
        self._children.clear()

    def _forget(self, block: int) -> None:
        """Drop a block from the index, and every block keyed under it (their keys name it)."""
        key = self._key_of.pop(block, None)
        if key is not None:
            del self._blocks[key]
            self._children[key[0]].discard(block)
        for child in self._children.pop(block, set()):  # unowned too: an owner would own block
            self._forget(child)
            self.allocator.uncache(child)
