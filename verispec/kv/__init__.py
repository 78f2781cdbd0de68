"""Paged KV cache bookkeeping: reference-counted block allocation and per-sequence block tables."""

from verispec.kv.block_allocator import BlockAllocator, CacheExhaustedError
from verispec.kv.block_table import BlockTable
from verispec.kv.prefix_cache import PrefixCache

__all__ = [
    "BlockAllocator",
    "BlockTable",
    "CacheExhaustedError",
    "PrefixCache",
]
