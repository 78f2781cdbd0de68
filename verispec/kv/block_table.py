"""One sequence's view of the paged KV cache: its blocks in order and how many slots are filled."""

from verispec.kv.block_allocator import BlockAllocator

__all__ = ["BlockTable"]


class BlockTable:
    """The blocks holding one sequence's KV entries, in order, and how many slots are filled.

    Position ``p`` of the sequence lives in slot ``blocks[p // block_size] * block_size +
    p % block_size`` of the flat KV storage. The table always holds exactly
    ``ceil(num_tokens / block_size)`` blocks: appends allocate blocks as needed and truncation
    (speculative rollback) frees those no longer needed, keeping a partially filled last block
    so that re-appended positions land in the same slots as before.

    Worked example, ``block_size=4``; another owner takes block 1 in between, so the
    sequence's blocks are not contiguous:

    >>> alloc = BlockAllocator(8)
    >>> table = BlockTable(alloc, block_size=4)
    >>> table.append_slots(3)            # positions 0..2 -> block 0
    [0, 1, 2]
    >>> alloc.allocate()                 # someone else's block
    1
    >>> table.append_slots(3)            # position 3 fills block 0; 4..5 go to block 2
    [3, 8, 9]
    >>> table.blocks, table.num_tokens, table.capacity
    ([0, 2], 6, 8)
    >>> table.truncate(2)                # reject positions 2..5: block 2 is freed
    >>> table.blocks, table.append_slots(2)
    ([0], [2, 3])
    """

    def __init__(self, allocator: BlockAllocator, block_size: int) -> None:
        """Create an empty table drawing blocks of ``block_size`` slots from ``allocator``."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.allocator: BlockAllocator = allocator
        self.block_size: int = block_size
        self.blocks: list[int] = []
        self.num_tokens: int = 0

    @property
    def capacity(self) -> int:
        """Token slots the held blocks provide, filled or not."""
        return len(self.blocks) * self.block_size

    def blocks_needed(self, num_new_tokens: int) -> int:
        """Extra blocks an append of ``num_new_tokens`` would take (0 if it fits)."""
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        total = -(-(self.num_tokens + num_new_tokens) // self.block_size)
        return max(0, total - len(self.blocks))

    def share(self, blocks: list[int]) -> None:
        """Start an empty table with full blocks someone else computed (a prefix cache hit);
        the caller already took an owner of each."""
        if self.blocks:
            raise ValueError("only an empty table can start with shared blocks")
        self.blocks = list(blocks)
        self.num_tokens = len(blocks) * self.block_size

    def append_slots(self, n: int) -> list[int]:
        """Reserve the next ``n`` positions and return their slot ids.

        Blocks are allocated all or nothing: on ``CacheExhaustedError`` neither the table nor
        the allocator has changed, so the scheduler can preempt and retry.
        """
        self.blocks.extend(self.allocator.allocate_many(self.blocks_needed(n)))
        start = self.num_tokens
        self.num_tokens += n
        return self.slots(start, self.num_tokens)

    def slots(self, start: int, end: int) -> list[int]:
        """Slot ids of the filled positions ``[start, end)``, in order."""
        if not 0 <= start <= end <= self.num_tokens:
            raise ValueError(
                f"positions [{start}, {end}) are not within the {self.num_tokens} filled ones"
            )
        size = self.block_size
        return [self.blocks[p // size] * size + p % size for p in range(start, end)]

    def truncate(self, num_tokens: int) -> None:
        """Keep the first ``num_tokens`` positions (speculative rollback) and free unneeded blocks.

        Raises ``ValueError`` if ``num_tokens`` is negative or more than are filled.
        """
        if not 0 <= num_tokens <= self.num_tokens:
            raise ValueError(
                f"cannot truncate to {num_tokens} tokens: must be in [0, {self.num_tokens}]"
            )
        keep = -(-num_tokens // self.block_size)
        for block in reversed(self.blocks[keep:]):  # last first: reused in their old order
            self.allocator.free(block)
        del self.blocks[keep:]
        self.num_tokens = num_tokens

    def free(self) -> None:
        """Release every block (the sequence finished or was preempted); the table is empty."""
        self.truncate(0)
