"""Reference-counted allocator of fixed-size KV cache blocks (CPU bookkeeping, no tensors).

The KV tensors are a flat slot space, ``slot = block_id * block_size + offset``; this module
only decides which block ids are in use and by how many owners. A block can have several
owners (a shared prompt prefix, a forked sequence), so it returns to the pool only when its
last owner frees it.
"""

from collections import deque

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

    @property
    def num_free(self) -> int:
        """Blocks with no owner, available to ``allocate``."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        """Blocks with at least one owner."""
        return self.num_blocks - len(self._free)

    def can_allocate(self, n: int) -> bool:
        """Whether ``n`` blocks could be allocated right now (lets the scheduler plan ahead)."""
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({n})")
        return n <= len(self._free)

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
        blocks = [self._free.popleft() for _ in range(n)]
        for block in blocks:
            self._refcounts[block] = 1
        return blocks

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
            self._free.appendleft(block)

    def refcount(self, block: int) -> int:
        """Number of owners of ``block`` (0 when free); ``ValueError`` for an id out of range."""
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"block id {block} out of range [0, {self.num_blocks})")
        return self._refcounts[block]
