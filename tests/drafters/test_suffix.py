"""Suffix decoding: the suffix trie against a brute-force scan of its sequences (counts,
continuations, longest match, after appends, interleaving and removals), speculation trees
against brute-force path probabilities, memory released on eviction, the proposer's
bookkeeping (finished outputs cached, preempted ones not), and greedy equality with plain
decoding through LLM, where a second pass drafts from the first pass's outputs."""

from __future__ import annotations

import random
import tracemalloc
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.checkpoints import SPEC_PAIRS
from verispec import LLM, SamplingParams, SpecConfig
from verispec.drafters.registry import check_spec
from verispec.drafters.suffix import SuffixConfig, SuffixProposer, grow_tree, speculate
from verispec.drafters.suffix_trie import CachedOutputs, SuffixTrie, _subtree_size
from verispec.types.stats import SpecStats

# Brute-force references: scans of the sequences themselves.


def ref_count(seqs: list[list[int]], pattern: list[int]) -> int:
    m = len(pattern)
    return sum(s[i : i + m] == pattern for s in seqs for i in range(len(s) - m + 1))


def ref_continuations(seqs: list[list[int]], pattern: list[int], depth: int) -> Counter[int]:
    """Tokens that followed pattern, where pattern + token fits in depth."""
    m = len(pattern)
    if m + 1 > depth:
        return Counter()
    return Counter(s[i + m] for s in seqs for i in range(len(s) - m) if s[i : i + m] == pattern)


def ref_longest_match(seqs: list[list[int]], context: list[int], depth: int) -> int:
    lengths = range(1, min(len(context), depth - 1) + 1)
    return max((m for m in lengths if ref_continuations(seqs, context[-m:], depth)), default=0)


def ref_path_probs(
    seqs: list[list[int]], pattern: list[int], depth: int, min_prob: float
) -> dict[tuple[int, ...], float]:
    """Every continuation path of pattern with its empirical probability >= min_prob."""
    out: dict[tuple[int, ...], float] = {}
    stack: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
    while stack:
        path, prob = stack.pop()
        nxt = ref_continuations(seqs, pattern + list(path), depth)
        total = sum(nxt.values())
        for token, count in nxt.items():
            p = prob * count / total
            if p >= min_prob:
                out[(*path, token)] = p
                stack.append(((*path, token), p))
    return out


def check_against_reference(trie: SuffixTrie, seqs: list[list[int]], extra: list[int]) -> None:
    """Counts and continuations of every substring (and of `extra`'s suffixes) match."""
    depth = trie.max_depth
    patterns = {tuple(s[i:j]) for s in [*seqs, extra] for i in range(len(s))
                for j in range(i + 1, min(len(s), i + depth) + 1)}  # fmt: skip
    for p in map(list, patterns):
        assert trie.count(p) == ref_count(seqs, p), p
        assert trie.continuations(p) == ref_continuations(seqs, p, depth), p
    for s in [*seqs, extra]:
        assert trie.longest_match(s) == ref_longest_match(seqs, s, depth), s
    assert _subtree_size(trie.root) - 1 == trie.num_nodes  # no node counted but unreachable


tokens = st.lists(st.integers(0, 3), max_size=24)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.lists(tokens, min_size=1, max_size=4), st.data())
def test_trie_matches_a_brute_force_scan(depth: int, seqs: list[list[int]], data: Any) -> None:
    """Sequences appended in random chunks, interleaved, then some removed."""
    trie = SuffixTrie(depth)
    done = [0] * len(seqs)
    while any(d < len(s) for d, s in zip(done, seqs, strict=True)):
        key = data.draw(st.sampled_from([i for i, s in enumerate(seqs) if done[i] < len(s)]))
        n = data.draw(st.integers(1, len(seqs[key]) - done[key]))
        trie.extend(key, seqs[key][done[key] : done[key] + n])
        done[key] += n
    live = [i for i, s in enumerate(seqs) if s]
    check_against_reference(trie, [seqs[i] for i in live], data.draw(tokens))
    gone = data.draw(st.lists(st.sampled_from(live), unique=True)) if live else []
    for key in gone:
        trie.remove(key)
    kept = [seqs[i] for i in live if i not in gone]
    check_against_reference(trie, kept, data.draw(tokens))
    if not kept:
        assert trie.num_nodes == 0 and trie.root.children == {}


def test_trie_hand_worked() -> None:
    trie = SuffixTrie(3)
    trie.extend("a", [1, 2, 1, 3])
    assert trie.count([1]) == 2 and trie.continuations([1]) == {2: 1, 3: 1}
    assert trie.continuations([2, 1]) == {3: 1} and trie.continuations([3]) == {}
    assert trie.continuations([1, 2, 1]) == {}  # a 4-token path is deeper than 3
    trie.extend("a", [1, 2])
    assert trie.count([1, 2]) == 2 and trie.continuations([1, 2]) == {1: 1}
    assert trie.longest_match([7, 3, 1]) == 2  # [3, 1] was followed by 2
    assert trie.longest_match([5]) == 0


def test_unrepeated_tokens_cost_one_node_each() -> None:
    """Lazy nodes: distinct tokens make one node each, not one per (token, depth)."""
    trie = SuffixTrie(24)
    trie.extend(0, list(range(500)))
    assert trie.num_nodes == 500
    trie.extend(1, list(range(500)))  # the same run again: explicit down to depth 24
    assert trie.num_nodes <= 500 * 24
    assert trie.count(list(range(10, 34))) == 2


@settings(max_examples=100, deadline=None)
@given(st.lists(tokens, min_size=1, max_size=3), tokens, st.integers(1, 8), st.data())
def test_trees_take_the_most_probable_paths(
    seqs: list[list[int]], context: list[int], budget: int, data: Any
) -> None:
    """grow_tree keeps the `budget` most probable paths of probability >= min_prob, and a
    node's probability is the brute-force product of its path's continuation frequencies."""
    depth = data.draw(st.integers(2, 6))
    min_prob = data.draw(st.sampled_from([0.0, 0.1, 0.3]))
    trie = SuffixTrie(depth)
    for key, s in enumerate(seqs):
        trie.extend(key, s)
    m = trie.longest_match(context)
    if m == 0:
        return
    pattern = context[len(context) - m :]
    cursor = trie.find(pattern)
    assert cursor is not None
    tree, score = grow_tree(trie, cursor, budget, min_prob)
    expected = ref_path_probs(seqs, pattern, depth, min_prob)
    paths = [tuple(tree.token_ids[i] for i in tree.path(n)) for n in range(tree.num_nodes)]
    got = sorted((expected[p] for p in paths), reverse=True)
    assert got == pytest.approx(sorted(expected.values(), reverse=True)[:budget])
    assert score == pytest.approx(sum(got))


def test_speculate_prefers_the_better_trie_and_a_roomier_match() -> None:
    config = SuffixConfig(max_tree_depth=8)
    own = SuffixTrie(8)
    own.extend(0, [1, 2, 3, 9, 1, 2])  # [1, 2] -> 3 once: budget 2
    cached = SuffixTrie(8)
    for key in range(3):
        cached.extend(key, [5, 1, 2, 4, 4, 4])  # [5, 1, 2] never in the context
    best = speculate([own, cached], own.sequence(0), 6, config)
    assert best.match_length == 2 and best.score == pytest.approx(2.0)
    assert best.tree.token_ids == [3, 9]  # the own trie, listed first, wins the tie
    long = [7, 7, 7, 7, 7, 7, 7, 7, 7]  # match 7 leaves room for 1 in depth 8; match 4 for 4
    trie = SuffixTrie(8)
    trie.extend(0, long)
    best = speculate([trie], long, 6, config)
    assert best.match_length == 4 and best.tree.token_ids == [7, 7, 7, 7]


def test_eviction_bounds_and_releases_memory() -> None:
    depth, keep = 8, 4
    cache = CachedOutputs(depth, keep)
    rng = random.Random(0)
    outputs = [[rng.randrange(12) for _ in range(rng.randrange(1, 40))] for _ in range(300)]
    for i, out in enumerate(outputs):
        cache.add(out)
        live = outputs[max(0, i - keep + 1) : i + 1]
        assert len(cache.trie) == len(live)
        # A node is a distinct path of <= depth tokens of a live output.
        assert cache.trie.num_nodes <= sum(len(o) * depth for o in live)
    check_against_reference(cache.trie, outputs[-keep:], outputs[0])
    cache.clear()
    assert cache.trie.num_nodes == 0 and cache.trie.root.children == {}
    assert CachedOutputs(depth, 0).add([1, 2]) is None  # keeps nothing


def test_removing_sequences_gives_the_memory_back() -> None:
    rng = random.Random(1)
    trie = SuffixTrie(24)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for key in range(40):
            trie.extend(key, [rng.randrange(20) for _ in range(200)])
        full = tracemalloc.get_traced_memory()[0]
        for key in range(40):
            trie.remove(key)
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert trie.num_nodes == 0
    assert after - before < 0.05 * (full - before), (before, full, after)


def fake_request(rid: str, prompt: list[int], output: list[int], finished: bool) -> Any:
    return SimpleNamespace(request_id=rid, prompt_token_ids=prompt, output_token_ids=output,
                           finished=finished)  # fmt: skip


def test_proposer_drafts_from_its_own_tokens_and_finished_outputs() -> None:
    proposer = SuffixProposer(SuffixConfig())
    first = fake_request("a", [1, 2, 3, 4, 5], [], False)
    drafts = proposer.propose([first], [4])
    assert drafts.probs is None and drafts.token_ids == [[]]  # nothing repeated yet
    assert drafts.trees is not None and drafts.trees[0].num_nodes == 0
    first.output_token_ids += [1, 2, 3]  # [1, 2, 3] occurred before, followed by 4, 5
    drafts = proposer.propose([first], [4])
    assert drafts.token_ids == [[4, 5, 1]] and proposer.requests["a"].sequence(0)[-3:] == [1, 2, 3]
    first.output_token_ids += [7, 8, 9, 10]
    proposer.release(fake_request("a", [], [7], False))  # preempted: not cached
    assert "a" not in proposer.requests and len(proposer.cached.trie) == 0
    proposer.release(first := fake_request("a", [1, 2], [7, 8, 9, 10, 11], True))
    assert len(proposer.cached.trie) == 1
    second = fake_request("b", [6, 7, 8, 9], [], False)  # [7, 8, 9] came in a's output
    drafts = proposer.propose([second, fake_request("c", [1], [], False)], [2, 4])
    assert drafts.token_ids == [[10, 11], []]
    proposer.clear_history()
    assert proposer.propose([second], [2]).token_ids == [[]]


def test_spec_config_fills_checks_and_refuses_the_suffix_options() -> None:
    spec = check_spec(SpecConfig(method="suffix", num_speculative_tokens=32))  # a node budget
    assert SuffixConfig.of(spec) == SuffixConfig()  # vLLM's defaults filled in
    assert spec.suffix_decoding_max_tree_depth == SuffixConfig().max_tree_depth
    given = SpecConfig(method="suffix", suffix_decoding_max_tree_depth=8,
                       suffix_decoding_max_cached_requests=0)  # fmt: skip
    assert SuffixConfig.of(given) == SuffixConfig(max_tree_depth=8, max_cached_requests=0)
    for field, value in [("max_tree_depth", 0), ("max_tree_depth", 2.5),
                         ("max_spec_factor", 0), ("max_spec_factor", True),
                         ("min_token_prob", 1.5), ("max_cached_requests", -1)]:  # fmt: skip
        with pytest.raises(ValueError, match=f"suffix_decoding_{field} must be"):
            check_spec(SpecConfig(method="suffix", **{f"suffix_decoding_{field}": value}))
    with pytest.raises(ValueError, match="'ngram' does not use suffix_decoding_min_token_prob"):
        check_spec(SpecConfig(method="ngram", suffix_decoding_min_token_prob=0.2))
    with pytest.raises(ValueError, match="'suffix' drafts trees of its own shape and does not"):
        check_spec(SpecConfig(method="suffix", tree_topk=2))
    with pytest.raises(ValueError, match="'suffix' does not use prompt_lookup_min"):
        check_spec(SpecConfig(method="suffix", prompt_lookup_min=2))
    with pytest.raises(ValueError, match="num_speculative_tokens must be"):
        check_spec(SpecConfig(method="suffix", num_speculative_tokens=65))


def suffix_spec(k: int) -> SpecConfig:
    return SpecConfig(method="suffix", num_speculative_tokens=k)


PROMPTS: list[str | list[int]] = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    "class Point:\n    def __init__(self, x, y):\n",
    [5, 9, 14, 5, 9, 14, 5, 9],
    [40, 41, 42, 43, 44, 45],
]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize(
    ("spec_pair", "k"),
    [
        pytest.param(SPEC_PAIRS[0], 4, id="llama-k4"),
        pytest.param(SPEC_PAIRS[1], 12, id="qwen2-k12"),
    ],
    indirect=["spec_pair"],
)
def test_greedy_equals_plain_and_later_requests_draft_from_earlier_outputs(
    spec_pair: tuple[Path, Path], k: int
) -> None:
    """Two passes over the prompts, two requests at a time: every output equals plain greedy
    decoding, and the second pass, whose outputs the first pass already produced, accepts far
    more (the cached outputs pay) yet still rejects some drafts on the first."""
    target, _ = spec_pair
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    ref = LLM(model=str(target), batch_invariant=True, speculative=None).generate(PROMPTS, params)
    llm = LLM(model=str(target), batch_invariant=True, speculative=suffix_spec(k), max_num_seqs=2)
    rates = []
    for _ in range(2):
        stats = llm.engine.spec_stats = SpecStats()
        out = llm.generate(PROMPTS, params)
        assert [o.token_ids for o in out] == [r.token_ids for r in ref]
        rates.append(stats.num_accepted_tokens / stats.num_draft_tokens)
    assert 0 < rates[0] < 1 and rates[1] > rates[0]
    assert stats.mean_acceptance_length is not None and stats.mean_acceptance_length > 1.5
    assert not llm.engine.proposer.requests  # every request's own trie was released
    assert len(llm.engine.proposer.cached.trie) == 2 * len(PROMPTS)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("spec_pair", [SPEC_PAIRS[0]], indirect=True, ids=["llama"])
def test_adaptive_speculation_cuts_suffix_trees_and_keeps_greedy_output(spec_pair) -> None:
    """The adaptive policy chooses each tree's node budget (0 to k, as a chain's depth); trees
    cut to any budget keep the output plain greedy decoding's."""
    target, _ = spec_pair
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    ref = LLM(model=str(target), batch_invariant=True, speculative=None).generate(PROMPTS, params)
    spec = SpecConfig(method="suffix", num_speculative_tokens=8, adaptive=True)
    llm = LLM(model=str(target), batch_invariant=True, speculative=spec, max_num_seqs=2)
    policy = llm.engine.spec_policy
    assert policy is not None and policy.depths == list(range(9))
    for _ in range(2):
        assert [o.token_ids for o in llm.generate(PROMPTS, params)] == [r.token_ids for r in ref]
    assert llm.engine.spec_stats.num_draft_tokens > 0
