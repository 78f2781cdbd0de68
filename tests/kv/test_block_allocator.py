"""Tests for the reference-counted KV block allocator."""

import doctest

import pytest

from verispec.kv import block_allocator
from verispec.kv.block_allocator import BlockAllocator, CacheExhaustedError


def test_docstring_examples() -> None:
    assert doctest.testmod(block_allocator).failed == 0


@pytest.mark.parametrize("num_blocks", [0, -1])
def test_rejects_empty_pool(num_blocks: int) -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        BlockAllocator(num_blocks)


def test_allocates_distinct_ids_until_exhausted() -> None:
    alloc = BlockAllocator(4)
    got = [alloc.allocate() for _ in range(4)]
    assert got == [0, 1, 2, 3]
    assert (alloc.num_free, alloc.num_used) == (0, 4)
    assert all(alloc.refcount(b) == 1 for b in got)
    with pytest.raises(CacheExhaustedError) as info:
        alloc.allocate()
    message = str(info.value)
    assert "0 of 4 are free" in message
    assert "4 in use" in message
    assert "num_blocks" in message and "max_num_seqs" in message


def test_free_returns_block_to_pool_last_freed_first() -> None:
    alloc = BlockAllocator(3)
    a, b, c = alloc.allocate(), alloc.allocate(), alloc.allocate()
    alloc.free(b)
    alloc.free(a)
    assert (alloc.num_free, alloc.num_used) == (2, 1)
    assert alloc.refcount(b) == 0
    # The last freed block comes back first.
    assert [alloc.allocate(), alloc.allocate()] == [a, b]
    assert alloc.refcount(c) == 1


def test_shared_block_stays_used_until_last_free() -> None:
    alloc = BlockAllocator(2)
    block = alloc.allocate()
    alloc.incref(block)
    alloc.incref(block)
    assert alloc.refcount(block) == 3
    alloc.free(block)
    alloc.free(block)
    assert alloc.refcount(block) == 1
    assert alloc.num_used == 1
    alloc.free(block)
    assert alloc.refcount(block) == 0
    assert alloc.num_used == 0


def test_double_free_raises() -> None:
    alloc = BlockAllocator(2)
    block = alloc.allocate()
    alloc.free(block)
    with pytest.raises(ValueError, match="double free"):
        alloc.free(block)
    assert alloc.num_free == 2


@pytest.mark.parametrize("bad", [-1, 2, 100])
def test_bad_ids_raise(bad: int) -> None:
    alloc = BlockAllocator(2)
    alloc.allocate_many(2)
    for op in (alloc.free, alloc.incref, alloc.refcount):
        with pytest.raises(ValueError, match="out of range"):
            op(bad)


def test_incref_of_free_block_raises() -> None:
    alloc = BlockAllocator(2)
    with pytest.raises(ValueError, match="not allocated"):
        alloc.incref(0)
    assert alloc.refcount(0) == 0


def test_allocate_many_is_all_or_nothing() -> None:
    alloc = BlockAllocator(5)
    assert alloc.allocate_many(3) == [0, 1, 2]
    assert alloc.can_allocate(2) and not alloc.can_allocate(3)
    with pytest.raises(CacheExhaustedError, match="3 block"):
        alloc.allocate_many(3)
    assert (alloc.num_free, alloc.num_used) == (2, 3)
    assert alloc.allocate_many(0) == []
    assert alloc.allocate_many(2) == [3, 4]


def test_negative_counts_raise() -> None:
    alloc = BlockAllocator(2)
    with pytest.raises(ValueError, match="negative"):
        alloc.can_allocate(-1)
    with pytest.raises(ValueError, match="negative"):
        alloc.allocate_many(-1)


def test_a_rolled_back_table_regrows_into_its_own_consecutive_blocks() -> None:
    from verispec.kv import BlockTable

    alloc = BlockAllocator(16)
    other = BlockTable(alloc, 4)
    table = BlockTable(alloc, 4)
    table.append_slots(9)  # blocks 0-2
    other.append_slots(4)  # block 3
    for grow in (8, 3, 12):  # speculative steps: append drafts, roll back most of them
        table.append_slots(grow)
        assert table.blocks == [0, 1, 2, 4, 5, 6][: len(table.blocks)]
        table.truncate(10)
    table.append_slots(10)  # 20 tokens
    assert table.blocks == [0, 1, 2, 4, 5]
