"""Reference-counted allocator of fixed-size KV cache blocks (CPU bookkeeping, no tensors).

The KV tensors are a flat slot space, ``slot = block_id * block_size + offset``; this module
only decides which block ids are in use and by how many owners. A block can have several
owners (a shared prompt prefix, a forked sequence), so it returns to the pool only when its
last owner frees it.
"""

from collections import OrderedDict, deque
from collections.abc import Callable

__all__ = ["BlockAllocator", "CacheExhaustedError"]


class CacheExhaustedError(RuntimeError):
    """No free KV block is left for a request.

    The message says how many blocks exist, how many are in use and what to do about it, so
    the error is actionable when it reaches a user instead of the scheduler preempting.
    """


class BlockAllocator:
    """Hands out fixed-size KV blocks by id, with reference counts so blocks can be shared.

    Allocation order is deterministic: at start the free list is ``0, 1, ..., n-1`` and a
    block whose last reference is dropped goes to the front (last freed, first reused), so the
    same sequence of calls always yields the same ids, and a sequence that is rolled back and
    grows again gets its own blocks back: a lone sequence's blocks stay consecutive, which lets
    attention read its keys in place (ForwardBatch.kv_start). Allocate and free are O(1).

    >>> alloc = BlockAllocator(3)
    >>> alloc.allocate(), alloc.allocate()
    (0, 1)
    >>> alloc.free(0); alloc.allocate_many(2)
    [0, 2]
    """

    def __init__(self, num_blocks: int) -> None:
        """Create a pool of ``num_blocks`` free blocks with ids ``0 .. num_blocks - 1``."""
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks: int = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._refcounts: list[int] = [0] * num_blocks
        self._cached: set[int] = set()
        """Blocks whose contents a prefix cache indexes (see mark_cached)."""
        self._evictable: OrderedDict[int, None] = OrderedDict()
        """Cached blocks with no owner, least recently freed first: reusable by a prefix hit
        (revive) until a new allocation needs them and evicts them."""
        self.on_evict: Callable[[int], None] | None = None
        """Called with a cached block's id when an allocation evicts it (the cache forgets it)."""

    @property
    def num_free(self) -> int:
        """Blocks with no owner, available to ``allocate`` (cached ones included: evictable)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used(self) -> int:
        """Blocks with at least one owner."""
        return self.num_blocks - self.num_free

    @property
    def num_evictable(self) -> int:
        """Blocks with no owner that a prefix cache still indexes."""
        return len(self._evictable)

    def can_allocate(self, n: int) -> bool:
        """Whether ``n`` blocks could be allocated right now (lets the scheduler plan ahead)."""
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({n})")
        return n <= self.num_free

    def allocate(self) -> int:
        """Take one free block with reference count 1; ``CacheExhaustedError`` if none is free."""
        return self.allocate_many(1)[0]

    def allocate_many(self, n: int) -> list[int]:
        """Take ``n`` free blocks, all or nothing: raises before taking any if too few are free."""
        if not self.can_allocate(n):
            raise CacheExhaustedError(
                f"KV cache exhausted: {n} block(s) requested but only {self.num_free} of "
                f"{self.num_blocks} are free ({self.num_used} in use); lower max_num_seqs or "
                f"max_model_len, or raise num_blocks"
            )
        blocks = [self._free.popleft() if self._free else self._evict() for _ in range(n)]
        for block in blocks:
            self._refcounts[block] = 1
        return blocks

    def _evict(self) -> int:
        """Take the least recently freed cached block; the cache is told to forget it."""
        block, _ = self._evictable.popitem(last=False)
        self._cached.discard(block)
        if self.on_evict is not None:
            self.on_evict(block)
        return block

    def mark_cached(self, block: int) -> None:
        """A prefix cache indexes this allocated block: when its last owner frees it, it stays
        readable (evictable) instead of returning to the free list."""
        if self.refcount(block) == 0:
            raise ValueError(f"cannot cache block {block}: it is not allocated")
        self._cached.add(block)

    def uncache(self, block: int) -> None:
        """The prefix cache forgot this block: an unowned one becomes plainly free."""
        self._cached.discard(block)
        if block in self._evictable:
            del self._evictable[block]
            self._free.appendleft(block)

    def revive(self, block: int) -> None:
        """Take an owner of a cached block, owned or evictable (a prefix cache hit)."""
        if block not in self._cached:
            raise ValueError(f"block {block} is not cached")
        if self._refcounts[block] == 0:
            del self._evictable[block]
        self._refcounts[block] += 1

    def incref(self, block: int) -> None:
        """Add an owner to an allocated block (sharing it); ``ValueError`` if it is free."""
        if self.refcount(block) == 0:
            raise ValueError(f"cannot share block {block}: it is not allocated")
        self._refcounts[block] += 1

    def free(self, block: int) -> None:
        """Drop one owner; at zero owners the block returns to the free list.

        Raises ``ValueError`` on a block that is already free (a double free) or out of range.
        """
        if self.refcount(block) == 0:
            raise ValueError(f"double free of block {block}: it is not allocated")
        self._refcounts[block] -= 1
        if self._refcounts[block] == 0:
            if block in self._cached:
                self._evictable[block] = None  # most recently freed last
            else:
                self._free.appendleft(block)

    def refcount(self, block: int) -> int:
        """Number of owners of ``block`` (0 when free); ``ValueError`` for an id out of range."""
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"block id {block} out of range [0, {self.num_blocks})")
        return self._refcounts[block]
