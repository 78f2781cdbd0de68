"""Tests for per-sequence block tables: slot mapping, rollback and leak-freedom."""

import doctest

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from verispec.kv import block_table
from verispec.kv.block_allocator import BlockAllocator, CacheExhaustedError
from verispec.kv.block_table import BlockTable


def test_docstring_examples() -> None:
    assert doctest.testmod(block_table).failed == 0


def test_rejects_bad_block_size() -> None:
    with pytest.raises(ValueError, match="block_size"):
        BlockTable(BlockAllocator(2), block_size=0)


def test_slots_cross_block_boundaries() -> None:
    alloc = BlockAllocator(8)
    table = BlockTable(alloc, block_size=4)
    other = BlockTable(alloc, block_size=4)
    # Interleave two sequences so this one's blocks are 0, 2, 3 (other holds block 1).
    assert table.append_slots(2) == [0, 1]
    assert other.append_slots(1) == [4]
    assert table.append_slots(7) == [2, 3, 8, 9, 10, 11, 12]
    assert table.blocks == [0, 2, 3]
    assert (table.num_tokens, table.capacity) == (9, 12)
    assert table.slots(3, 6) == [3, 8, 9]
    assert table.slots(5, 5) == []
    assert alloc.num_used == 4


@pytest.mark.parametrize(("start", "end"), [(-1, 2), (3, 2), (0, 4)])
def test_slots_outside_filled_positions_raise(start: int, end: int) -> None:
    table = BlockTable(BlockAllocator(2), block_size=4)
    table.append_slots(3)
    with pytest.raises(ValueError, match="filled"):
        table.slots(start, end)


def test_blocks_needed() -> None:
    table = BlockTable(BlockAllocator(8), block_size=4)
    assert [table.blocks_needed(n) for n in (0, 1, 4, 5, 9)] == [0, 1, 1, 2, 3]
    table.append_slots(3)
    assert [table.blocks_needed(n) for n in (0, 1, 2, 5, 6)] == [0, 0, 1, 1, 2]
    table.append_slots(1)
    assert [table.blocks_needed(n) for n in (0, 1, 4, 5)] == [0, 1, 1, 2]
    with pytest.raises(ValueError, match="num_new_tokens"):
        table.blocks_needed(-1)


@pytest.mark.parametrize(
    ("keep", "blocks_left"),
    [(10, [0, 1, 2]), (6, [0, 1]), (8, [0, 1]), (4, [0]), (1, [0]), (0, [])],
)
def test_truncate_frees_exactly_unneeded_blocks(keep: int, blocks_left: list[int]) -> None:
    alloc = BlockAllocator(6)
    table = BlockTable(alloc, block_size=4)
    before = table.append_slots(10)  # blocks 0, 1, 2; the last is half full
    table.truncate(keep)
    assert table.blocks == blocks_left
    assert table.num_tokens == keep
    assert alloc.num_used == len(blocks_left)
    assert table.slots(0, keep) == before[:keep]
    # Positions still inside the kept blocks get their old slots back.
    again = table.append_slots(10 - keep)
    reused = len(blocks_left) * 4 - keep
    assert again[:reused] == before[keep : keep + reused]


def test_truncate_out_of_range_raises() -> None:
    table = BlockTable(BlockAllocator(2), block_size=4)
    table.append_slots(3)
    for bad in (-1, 4):
        with pytest.raises(ValueError, match="truncate"):
            table.truncate(bad)
    assert (table.num_tokens, table.blocks) == (3, [0])


def test_failed_append_changes_nothing() -> None:
    alloc = BlockAllocator(3)
    table = BlockTable(alloc, block_size=4)
    table.append_slots(6)  # blocks 0, 1
    with pytest.raises(CacheExhaustedError):
        table.append_slots(7)  # needs 2 more blocks, only 1 free
    assert (table.blocks, table.num_tokens) == ([0, 1], 6)
    assert (alloc.num_free, alloc.num_used) == (1, 2)
    assert table.append_slots(6) == [6, 7, 8, 9, 10, 11]


def test_free_releases_everything() -> None:
    alloc = BlockAllocator(4)
    table = BlockTable(alloc, block_size=2)
    table.append_slots(7)
    table.free()
    assert (table.blocks, table.num_tokens, table.capacity) == ([], 0, 0)
    assert alloc.num_free == 4
    table.free()  # freeing an empty table is harmless
    assert alloc.num_free == 4


def test_shared_block_survives_one_owner_freeing() -> None:
    alloc = BlockAllocator(4)
    table = BlockTable(alloc, block_size=4)
    table.append_slots(4)
    alloc.incref(table.blocks[0])  # e.g. a prefix cache holds it too
    table.free()
    assert alloc.refcount(0) == 1
    assert alloc.num_used == 1


NUM_TABLES = 3
table_index = st.integers(0, NUM_TABLES - 1)


class BlockTablesMachine(RuleBasedStateMachine):
    """Random appends, rollbacks and frees over several tables sharing one small allocator.

    ``known[t]`` models the slot of every position table ``t`` holds a block for, so a
    re-append after rollback must return exactly the slots those positions had before.
    """

    @initialize(block_size=st.integers(1, 5), num_blocks=st.integers(1, 12))
    def setup(self, block_size: int, num_blocks: int) -> None:
        self.alloc = BlockAllocator(num_blocks)
        self.tables = [BlockTable(self.alloc, block_size) for _ in range(NUM_TABLES)]
        self.known: list[list[int]] = [[] for _ in range(NUM_TABLES)]

    @rule(t=table_index, n=st.integers(0, 12))
    def append(self, t: int, n: int) -> None:
        table = self.tables[t]
        start, blocks_before = table.num_tokens, list(table.blocks)
        free_before = self.alloc.num_free
        if table.blocks_needed(n) > free_before:
            with pytest.raises(CacheExhaustedError):
                table.append_slots(n)
            assert (table.num_tokens, table.blocks) == (start, blocks_before)
            assert self.alloc.num_free == free_before
            return
        got = table.append_slots(n)
        assert len(got) == n
        known = self.known[t]
        reused = min(len(known), start + n) - start
        assert got[:reused] == known[start : start + reused]
        known.extend(got[reused:])

    @rule(t=table_index, data=st.data())
    def truncate(self, t: int, data: st.DataObject) -> None:
        table = self.tables[t]
        keep = data.draw(st.integers(0, table.num_tokens))
        table.truncate(keep)
        del self.known[t][table.capacity :]

    @rule(t=table_index)
    def free(self, t: int) -> None:
        self.tables[t].free()
        self.known[t].clear()

    @invariant()
    def no_leak_and_no_sharing(self) -> None:
        held = [b for table in self.tables for b in table.blocks]
        assert len(held) == len(set(held)) == self.alloc.num_used
        assert self.alloc.num_free + self.alloc.num_used == self.alloc.num_blocks
        assert all(self.alloc.refcount(b) == 1 for b in held)
        live: set[int] = set()
        for table, known in zip(self.tables, self.known, strict=True):
            assert table.capacity == -(-table.num_tokens // table.block_size) * table.block_size
            slots = table.slots(0, table.num_tokens)
            assert slots == known[: table.num_tokens]
            assert live.isdisjoint(slots)
            live.update(slots)


TestBlockTablesMachine = BlockTablesMachine.TestCase
