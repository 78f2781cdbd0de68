"""PrefixCache and the allocator's cached blocks: exact matches only, shared by reference count,
evicted least recently freed first (with everything keyed under them); the engine's output is
the same with the cache as without, bit for bit in batch-invariant mode."""

from __future__ import annotations

import random

import pytest

from tests.helpers.checkpoints import SPEC_PAIRS
from verispec import LLM, SamplingParams
from verispec.kv import BlockAllocator, BlockTable, PrefixCache
from verispec.kv.prefix_cache import STOP

pytestmark = pytest.mark.usefixtures("one_thread")


def computed(cache: PrefixCache, tokens: list[int], allocator: BlockAllocator) -> BlockTable:
    """A table that computed `tokens` from scratch (after its match), indexed as the engine does."""
    table = BlockTable(allocator, cache.block_size)
    matched = cache.match(tokens)
    table.share(matched)
    table.append_slots(len(tokens) - table.num_tokens)
    cache.insert(table, tokens, len(matched), len(tokens))
    return table


def test_worked_example_of_the_module() -> None:
    allocator = BlockAllocator(8)
    cache = PrefixCache(allocator, block_size=2)
    a = computed(cache, [5, 6, 7, 8, 9], allocator)
    assert a.blocks == [0, 1, 2] and len(cache) == 2  # the partial block 2 is not indexed
    assert cache.match([5, 6, 7, 8, 3]) == [0, 1]
    assert allocator.refcount(0) == 2
    assert cache.match([5, 6, 7, 8]) == [0]  # the last token must be left to compute
    assert cache.match([6, 5, 7, 8, 9]) == []  # same tokens in another order: no match
    assert cache.match([1, 5, 6, 7, 8]) == []  # same block content after another prefix


def test_reset_forgets_every_block_and_frees_the_unowned() -> None:
    allocator = BlockAllocator(8)
    cache = PrefixCache(allocator, block_size=2)
    a = computed(cache, [5, 6, 7, 8, 9], allocator)
    computed(cache, [5, 6, 1, 2, 3], allocator).free()  # block 3 ([1, 2]): cached, unowned
    assert len(cache) == 3 and allocator.num_evictable == 1
    cache.reset()
    assert len(cache) == 0 and cache.match([5, 6, 7, 8, 9]) == []
    assert allocator.num_evictable == 0 and allocator.num_used == 3  # a's blocks stay a's
    a.free()
    assert allocator.num_free == 8 and allocator.num_evictable == 0  # nothing left cached


def test_lookahead_keys_hold_the_next_token() -> None:
    """A drafter's block whose rows read one token further (an EAGLE head) matches only where
    that token matches too; peek takes nothing, max_blocks caps a match."""
    allocator = BlockAllocator(8)
    cache = PrefixCache(allocator, block_size=2, lookahead=1)
    table = BlockTable(allocator, 2)
    table.append_slots(5)
    assert cache.insert(table, [5, 6, 7, 8], 0, 5) == 1  # block 1's key needs token 4
    assert cache.insert(table, [5, 6, 7, 8, 9], 1, 5) == 2
    assert cache.peek([5, 6, 7, 8, 3]) == [0] and allocator.refcount(0) == 1
    assert cache.peek([5, 6, 7, 8, 9, 1]) == [0, 1]
    assert cache.match([5, 6, 7, 8, 9, 1], max_blocks=1) == [0] and allocator.refcount(0) == 2
    with pytest.raises(ValueError, match="lookahead"):
        PrefixCache(allocator, 2, lookahead=2)


def test_freed_blocks_stay_readable_until_evicted_least_recent_first() -> None:
    allocator = BlockAllocator(4)
    cache = PrefixCache(allocator, block_size=2)
    # blocks 0, 1 indexed, 2 partial; a table frees its last block first, so the tail of a
    # prefix (block 1) is evicted before its head (block 0)
    computed(cache, [1, 2, 3, 4, 0], allocator).free()
    computed(cache, [7, 8, 0], allocator).free()  # blocks 2 (indexed), 3: the free list first
    assert allocator.num_used == 0 and allocator.num_free == 4 and allocator.num_evictable == 3
    assert allocator.allocate_many(2) == [3, 1]  # the free block, then the least recent
    assert cache.match([1, 2, 3, 4, 0]) == [0]  # its head survives
    assert cache.match([7, 8, 0]) == [2]
    allocator.free(0)
    allocator.free(2)
    assert allocator.allocate_many(2) == [0, 2]  # evicting block 0 would forget its children
    assert len(cache) == 0 and allocator.num_evictable == 0


def test_evicting_a_block_forgets_the_blocks_keyed_under_it() -> None:
    allocator = BlockAllocator(3)
    cache = PrefixCache(allocator, block_size=1)
    table = computed(cache, [4, 5, 6], allocator)  # blocks 0, 1, 2: a chain, all indexed
    for block in table.blocks:  # the head loses its owner first: the least recent
        allocator.free(block)
    assert allocator.allocate() == 0  # evicts the head: 1 and 2 are forgotten and freed
    assert len(cache) == 0 and allocator.num_evictable == 0 and allocator.num_free == 2


def test_a_block_computed_twice_at_once_keeps_the_first_and_stops_the_twin() -> None:
    allocator = BlockAllocator(8)
    cache = PrefixCache(allocator, block_size=2)
    first, twin = BlockTable(allocator, 2), BlockTable(allocator, 2)
    for table in (first, twin):
        table.append_slots(5)
    assert cache.insert(first, [1, 2, 3, 4, 5], 0, 5) == 2
    assert cache.insert(twin, [1, 2, 3, 4, 5], 0, 5) == STOP
    assert cache.insert(twin, [1, 2, 3, 4, 5, 6, 7], STOP, 7) == STOP
    assert cache.match([1, 2, 3, 4, 5]) == first.blocks[:2]


def test_random_workload_matches_a_brute_force_reference() -> None:
    """Random sequences sharing prefixes, most freed at once, some kept, on a pool that forces
    evictions: every matched block holds exactly the tokens it was matched for (its content as
    last computed, tracked here by brute force)."""
    rng = random.Random(0)
    size = 3
    allocator = BlockAllocator(40)
    cache = PrefixCache(allocator, size)
    contents: dict[int, tuple[int, ...]] = {}  # block -> the token prefix it ends
    hits = 0
    for _ in range(300):
        base = rng.choice([[1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 9, 9], [7, 7, 7]])
        tokens = base[: rng.randint(0, len(base))] + [rng.randint(0, 3) for _ in range(5)]
        if len(tokens) < 2:
            continue
        blocks = cache.match(tokens)
        hits += len(blocks)
        for i, block in enumerate(blocks):
            assert contents[block] == tuple(tokens[: (i + 1) * size])
        table = BlockTable(allocator, size)
        table.share(blocks)
        if not allocator.can_allocate(table.blocks_needed(len(tokens) - table.num_tokens)):
            table.free()
            continue
        table.append_slots(len(tokens) - table.num_tokens)
        for i, block in enumerate(table.blocks[: len(tokens) // size]):
            contents[block] = tuple(tokens[: (i + 1) * size])
        cache.insert(table, tokens, len(blocks), len(tokens))
        if rng.random() < 0.9:
            table.free()
    assert hits > 100  # the shared bases were found again and again


PROMPTS = ["for i in range(10):\n    print(i) " * 3 + s for s in ("x", "class A:", "def f():")]


@pytest.mark.parametrize("spec_pair", [SPEC_PAIRS[0]], indirect=True, ids=["llama"])
@pytest.mark.parametrize("method", ["plain", "draft_model", "ngram"])
def test_output_with_the_cache_equals_output_without(spec_pair, method: str) -> None:
    target, draft = spec_pair
    spec = {"plain": None, "ngram": {"method": "ngram", "num_speculative_tokens": 3},
            "draft_model": {"model": str(draft), "num_speculative_tokens": 3}}[method]  # fmt: skip
    params = [SamplingParams(temperature=0, max_tokens=12),
              SamplingParams(temperature=1.0, max_tokens=12, seed=4)]  # fmt: skip
    results = []
    for enabled in (False, True):
        llm = LLM(model=str(target), batch_invariant=True, speculative=spec, block_size=4,
                  enable_prefix_caching=enabled)  # fmt: skip
        outs = [llm.generate(p, q)[0] for q in params for p in PROMPTS]  # one at a time
        outs += llm.generate(PROMPTS, params[0])  # and batched
        results.append([(o.token_ids, o.text) for o in outs])
        if enabled:
            cache = llm.engine.prefix_cache
            assert cache is not None and cache.num_hits > 0.5 * cache.num_queries
            if method == "draft_model":  # the draft model's own cache is shared too
                own = llm.engine.proposer.prefix_cache
                assert own is not None and own.num_hits > 0.5 * own.num_queries
                assert llm.engine.proposer.allocator.num_used == 0
            assert llm.reset_prefix_cache() and len(cache) == 0  # then a pass starts cold
            hits = cache.num_hits
            again = llm.generate(PROMPTS[0], params[0])[0]
            assert cache.num_hits == hits and again.token_ids == outs[0].token_ids
            if method == "draft_model":
                assert len(llm.engine.proposer.prefix_cache) > 0  # refilled by that request
        assert llm.engine.allocator.num_used == 0
    assert results[0] == results[1]


def test_no_reset_while_a_request_runs(llama_checkpoint) -> None:
    llm = LLM(model=str(llama_checkpoint), enable_prefix_caching=True, block_size=4)
    with llm.generate_stream(PROMPTS[0], SamplingParams(temperature=0, max_tokens=6)) as stream:
        next(iter(stream))
        assert llm.reset_prefix_cache() is False  # the running request's blocks stay indexed
    assert llm.reset_prefix_cache() is True and len(llm.engine.prefix_cache) == 0


@pytest.mark.parametrize("drafter", [False, True], ids=["plain", "draft_model"])
def test_eviction_under_pressure_keeps_outputs(spec_pair, drafter: bool) -> None:
    """A cache too small to keep everything: blocks are evicted and reused (the draft model's
    own cache too), output unchanged."""
    target, draft = spec_pair
    spec = {"model": str(draft), "num_speculative_tokens": 3} if drafter else None
    params = SamplingParams(temperature=0, max_tokens=10)
    prompts = [f"def f{i}(x):\n    return x * {i} " * 4 for i in range(6)] * 2
    plain = LLM(model=str(target), batch_invariant=True, speculative=None)
    small = LLM(model=str(target), batch_invariant=True, speculative=spec, block_size=4,
                num_blocks=64, max_model_len=256, enable_prefix_caching=True)  # fmt: skip
    want = [o.token_ids for o in plain.generate(prompts, params)]
    assert [o.token_ids for o in small.generate(prompts, params)] == want
    assert [small.generate(p, params)[0].token_ids for p in prompts] == want

