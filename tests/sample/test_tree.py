"""Draft trees and verify_tree, no model: tree structure (masks, positions, paths, histories),
the greedy rule against a brute-force longest matching path, chains against rejection.verify,
and exactness of tree sampling on a fake target whose rows depend on their path: the joint law
of the first 2 and 3 emitted tokens must match the exact one (verispec/audit/fit.py), while a
verifier that forgets to remove rejected siblings must fail the same check."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verispec.audit.fit import Fit, fit
from verispec.sample import SamplingTensors, sample, tree, warp
from verispec.sample.noise import NoiseKey
from verispec.sample.rejection import Verdict, verify
from verispec.sample.tree import DraftTree, verify_tree
from verispec.types.sampling_params import SamplingParams

CHAIN, STAR = [-1, 0, 1], [-1, -1, -1]
TWO_LEVEL, UNBALANCED = [-1, -1, 0, 0, 1, 1], [-1, -1, -1, 0, 0, 3]


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def tensors(params: dict, histories: Sequence[Sequence[int]], vocab: int) -> SamplingTensors:
    """One row of SamplingParams(**params) per history (the row's output ids), prompt [4]."""
    rows = [SamplingParams(**params)] * len(histories)
    return SamplingTensors.build(rows, [[4]] * len(rows), [list(h) for h in histories], vocab)


# --- structure ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token_ids", "parents", "message"),
    [
        ([1, 2], [-1], "one entry per node, got 2 and 1"),
        ([1, 2], [-1, 1], r"parents\[1\] must be -1 \(the root\) or an earlier node in \[0, 1\)"),
        ([1], [-2], r"parents\[0\] must be -1"),
        ([1, 2, 1], [-1, -1, -1], "node 2 repeats token 1 of a sibling under -1"),
        ([3, 5, 5], [-1, 0, 0], "node 2 repeats token 5 of a sibling under 0"),
        ([-1], [-1], "token_ids must be >= 0, got -1"),
    ],
)
def test_bad_trees_are_value_errors(token_ids: list, parents: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DraftTree(token_ids, parents)


def test_node_outside_the_tree_is_a_value_error() -> None:
    t = DraftTree.chain([3, 4])
    with pytest.raises(ValueError, match=r"node must be in \[0, 2\), got -1"):
        t.path(-1)
    with pytest.raises(ValueError, match=r"node must be in \[-1, 2\), got 2"):
        t.children(2)


def test_same_token_under_different_parents_is_fine() -> None:
    assert DraftTree([3, 3, 3], [-1, 0, 1]).depths() == [1, 2, 3]


SHAPES = {  # parents, depths, children of the root, path of the last node, mask rows
    "chain": (CHAIN, [1, 2, 3], [0], [0, 1, 2], "1000 1100 1110 1111"),
    "star": (STAR, [1, 1, 1], [0, 1, 2], [2], "1000 1100 1010 1001"),
    "two-level": (TWO_LEVEL, [1, 1, 2, 2, 2, 2], [0, 1], [1, 5],
                  "1000000 1100000 1010000 1101000 1100100 1010010 1010001"),
    "unbalanced": (UNBALANCED, [1, 1, 1, 2, 2, 3], [0, 1, 2], [0, 3, 5],
                   "1000000 1100000 1010000 1001000 1100100 1100010 1100101"),
}  # fmt: skip


@pytest.mark.parametrize("shape", SHAPES)
def test_shapes(shape: str) -> None:
    parents, depths, root_children, last_path, mask = SHAPES[shape]
    t = DraftTree([10 + i for i in range(len(parents))], parents)
    assert t.num_nodes == len(parents) and t.depths() == depths
    assert t.children(-1) == root_children and t.path(t.num_nodes - 1) == last_path
    assert t.attention_mask().tolist() == [[c == "1" for c in row] for row in mask.split()]
    assert t.positions(7) == [7, *(7 + d for d in depths)]
    histories = t.row_histories()
    assert histories[0] == [] and len(histories) == t.num_nodes + 1
    for i in range(t.num_nodes):
        assert histories[1 + i] == [t.token_ids[j] for j in t.path(i)]
        assert i in t.children(parents[i]) and len(t.path(i)) == depths[i]


def test_graft_worked_example_and_edge_cases() -> None:
    t = DraftTree([5, 7, 2], [-1, -1, 0])
    grafted = t.graft([5, 3, 8])
    assert (grafted.token_ids, grafted.parents) == ([5, 7, 2, 3, 8], [-1, -1, 0, 0, 3])
    assert t.token_ids == [5, 7, 2]  # the tree itself is unchanged
    assert t.graft([5, 2]) == t and t.graft([]) == t  # a path it holds adds nothing
    assert DraftTree([], []).graft([4, 8]) == DraftTree.chain([4, 8])
    assert t.graft([9]).children(-1) == [0, 1, 3]


@given(st.lists(st.integers(0, 3), max_size=5), st.lists(st.integers(0, 3), max_size=5),
       st.lists(st.integers(0, 3), max_size=5))  # fmt: skip
def test_graft_holds_every_path_once(a: list[int], b: list[int], c: list[int]) -> None:
    """Grafting chains onto an empty tree gives a valid tree whose root paths are exactly the
    chains' prefixes (siblings distinct: DraftTree checks it)."""
    t = DraftTree([], []).graft(a).graft(b).graft(c)
    paths = {tuple(t.token_ids[n] for n in t.path(i)) for i in range(t.num_nodes)}
    prefixes = {tuple(x[:j]) for x in (a, b, c) for j in range(1, len(x) + 1)}
    assert paths == prefixes and t.num_nodes == len(prefixes)


def test_chain_classmethod_and_empty_tree() -> None:
    assert DraftTree.chain([4, 8, 1]).parents == [-1, 0, 1]
    empty = DraftTree.chain([])
    assert empty.num_nodes == 0 and empty.attention_mask().tolist() == [[True]]
    assert empty.positions(3) == [3] and empty.row_histories() == [[]]


@st.composite
def trees(draw: st.DrawFn, vocab: int = 5, most: int = 9) -> DraftTree:
    """A random valid tree: each node picks an earlier parent and a token its siblings lack."""
    tokens: list[int] = []
    parents: list[int] = []
    for _ in range(draw(st.integers(0, most))):
        parent = draw(st.integers(-1, len(parents) - 1))
        free = [x for x in range(vocab) if (parent, x) not in zip(parents, tokens, strict=True)]
        if free:
            parents.append(parent)
            tokens.append(draw(st.sampled_from(free)))
    return DraftTree(tokens, parents)


@settings(max_examples=80, deadline=None)
@given(t=trees())
def test_mask_is_self_root_and_ancestors(t: DraftTree) -> None:
    mask = t.attention_mask()
    for i in range(t.num_nodes):
        visible = {0, *(1 + j for j in t.path(i))}
        assert {c for c in range(t.num_nodes + 1) if mask[1 + i, c]} == visible
        assert t.positions(0)[1 + i] == len(t.path(i))


# --- greedy -------------------------------------------------------------------------------------


def longest_match(t: DraftTree, argmax: Sequence[int]) -> tuple[list[int], int]:
    """Brute force: the deepest node whose whole path equals the argmax of each parent's row."""

    def row(node: int) -> int:
        return 0 if node < 0 else 1 + node

    matching = [
        t.path(i) for i in range(t.num_nodes)
        if all(t.token_ids[j] == argmax[row(t.parents[j])] for j in t.path(i))
    ]  # fmt: skip
    best = max(matching, key=len, default=[])
    return best, argmax[row(best[-1] if best else -1)]


@st.composite
def greedy_batches(draw: st.DrawFn, vocab: int = 5) -> tuple[list[DraftTree], torch.Tensor]:
    """1-3 random trees and logits whose rows often peak at one of the row's children."""
    batch = draw(st.lists(trees(vocab), min_size=1, max_size=3))
    g = seeded(draw(st.integers(0, 2**20)))
    rows = []
    for t in batch:
        for node in range(-1, t.num_nodes):
            logits = torch.randn(vocab, generator=g)  # [vocab]
            kids = t.children(node)
            if kids and float(torch.rand(1, generator=g)) < 0.7:
                logits[t.token_ids[kids[int(torch.randint(len(kids), (1,), generator=g))]]] = 9.0
            rows.append(logits)
    return batch, torch.stack(rows)


@pytest.mark.parametrize("penalty", [False, True])
@settings(max_examples=60, deadline=None)
@given(b=greedy_batches())
def test_greedy_is_the_longest_path_matching_the_argmax(b: tuple, penalty: bool) -> None:
    """Fast path (raw argmax); with a repetition penalty, rows see their path's tokens."""
    batch, logits = b
    params = dict(temperature=0.0, repetition_penalty=3.0 if penalty else 1.0)
    histories = [h for t in batch for h in t.row_histories()]
    t = tensors(params, histories, logits.shape[1])
    v = verify_tree(logits, batch, t, [None] * len(batch))
    argmax = (warp(logits, t) if penalty else logits).argmax(dim=1).tolist()
    row = 0
    for r, tr in enumerate(batch):
        path, final = longest_match(tr, argmax[row : row + tr.num_nodes + 1])
        assert v.paths[r] == path and v.num_accepted[r] == len(path)
        assert v.token_ids[r] == [*(tr.token_ids[i] for i in path), final]
        row += tr.num_nodes + 1


@settings(max_examples=60, deadline=None)
@given(
    drafts=st.lists(st.lists(st.integers(0, 3), max_size=4), min_size=1, max_size=3),
    seed=st.integers(0, 2**20),
    mixed=st.booleans(),
)
def test_greedy_chain_equals_rejection_verify(drafts: list, seed: int, mixed: bool) -> None:
    """Chains in greedy mode, alone (fast path) or beside a sampled request (warped path)."""
    rows = sum(len(d) + 1 for d in drafts)
    logits = torch.randn(rows, 4, generator=seeded(seed)) * 3  # [rows, 4]: argmax often drafted
    params = [SamplingParams(temperature=0.0)] * rows
    if mixed:
        logits, drafts = torch.cat([logits, torch.zeros(1, 4)]), [*drafts, []]
        params = [*params, SamplingParams(temperature=1.0)]
    t = SamplingTensors.build(params, [[]] * len(params), [[]] * len(params), 4)
    keys = [NoiseKey(seed + r, r) for r in range(len(drafts))]
    chain = verify_tree(logits, [DraftTree.chain(d) for d in drafts], t, keys)
    expected = verify(logits, drafts, None, t, keys)
    n = len(drafts) - mixed
    assert chain.token_ids[:n] == expected.token_ids[:n]
    assert chain.num_accepted[:n] == expected.num_accepted[:n]


# --- sampling: reproducible, plain when empty, bad input ----------------------------------------

MIXED = [DraftTree([1, 2, 0], [-1, -1, 0]), DraftTree([], []), DraftTree.chain([3, 1])]
MIXED_PARAMS = [dict(temperature=0.8, top_k=3)] * 4 + [dict(temperature=0.0)] + [{}] * 3


def run_mixed(seeds: Sequence[int], only: int | None = None) -> Verdict:
    """verify_tree on MIXED (sampled, greedy, sampled) or on its request `only` alone, request
    r's root at output position seeds[r] % 7 of seed seeds[r]."""
    logits = torch.randn(8, 5, generator=seeded(3))  # [8, 5]
    params = [SamplingParams(**p) for p in MIXED_PARAMS]
    batch = MIXED
    if only is not None:
        rows = slice([0, 4, 5][only], [4, 5, 8][only])
        logits, params, batch = logits[rows], params[rows], [MIXED[only]]
    t = SamplingTensors.build(params, [[]] * len(params), [[]] * len(params), 5)
    return verify_tree(logits, batch, t, [NoiseKey(s, s % 7) for s in seeds])


def test_seeded_trees_reproduce_and_batch_mates_do_not_matter() -> None:
    verdicts = [run_mixed([s, 100 + s, 200 + s]) for s in range(30)]
    assert [run_mixed([s, 100 + s, 200 + s]) for s in range(30)] == verdicts
    assert len({str(v.token_ids) for v in verdicts}) > 5  # the seeds do change the draws
    for s in range(30):
        for r in range(3):
            alone = run_mixed([[s, 100 + s, 200 + s][r]], only=r)
            assert alone.token_ids[0] == verdicts[s].token_ids[r]
            assert alone.paths[0] == verdicts[s].paths[r]


def test_empty_tree_is_plain_sampling() -> None:
    logits = torch.randn(2, 50, generator=seeded(1))
    t = tensors(dict(temperature=0.9, top_p=0.8), [[], []], 50)
    for keys in ([NoiseKey(5, 0), NoiseKey(6, 2)], [None, None]):
        v = verify_tree(logits, [DraftTree([], [])] * 2, t, keys, seeded(1))
        expected = sample(warp(logits, t), keys, generator=seeded(1))
        assert v.token_ids == [[int(x)] for x in expected] and v.paths == [[], []]


def test_no_trees_is_an_empty_verdict() -> None:
    v = verify_tree(torch.zeros(0, 5), [], tensors({}, [], 5), [])
    assert v == Verdict(token_ids=[], num_accepted=[], paths=[])


def test_bad_verify_input_is_a_value_error() -> None:
    t = tensors({}, [[]] * 3, 5)
    chain = DraftTree.chain([1, 2])
    with pytest.raises(ValueError, match=r"needs 4 logits rows and sampling rows .* got 3 and 3"):
        verify_tree(torch.zeros(3, 5), [chain, DraftTree([], [])], t, [None, None])
    with pytest.raises(ValueError, match=r"one noise key per tree \(1\), got 2"):
        verify_tree(torch.zeros(3, 5), [chain], t, [None, None])
    with pytest.raises(ValueError, match="below the vocabulary size 2"):
        verify_tree(torch.zeros(3, 2), [chain], tensors({}, [[]] * 3, 2), [None])


# --- sampling exactness -------------------------------------------------------------------------
# The fake target's row after path h: TARGET[len(h), last token of root + h] over VOCAB tokens.
# The draft (a different table) picks each node's children as its own top-k, in order.

VOCAB, ROOT, TOKENS, ALPHA = 6, 4, 3, 1e-3
VOCABULARY = range(VOCAB)
TARGET = torch.randn(5, VOCAB, VOCAB, generator=seeded(11)) * 1.5  # [depth, last, vocab]
DRAFT = TARGET + torch.randn(5, VOCAB, VOCAB, generator=seeded(12))  # [depth, last, vocab]
PENALTIES = dict(temperature=0.8, repetition_penalty=1.5, presence_penalty=0.5)
CASES = {
    "t0.7-top_p0.9-two-level": (dict(temperature=0.7, top_p=0.9), TWO_LEVEL),
    "t1.0-top_k3-unbalanced": (dict(temperature=1.0, top_k=3), UNBALANCED),
    "t1.0-star": (dict(temperature=1.0), STAR),
    "t0.7-top_k3-chain": (dict(temperature=0.7, top_k=3), CHAIN),
    "penalties-see-the-path-two-level": (PENALTIES, TWO_LEVEL),
}


def row_logits(table: torch.Tensor, path: Sequence[int]) -> torch.Tensor:
    """[VOCAB] the table's logits after the root and then `path`."""
    return table[len(path), path[-1] if path else ROOT]


def draft_tree(parents: list[int]) -> DraftTree:
    """Node tokens chosen by the draft: a node's k children get its k most likely tokens."""
    tokens: list[int] = []
    for i, parent in enumerate(parents):
        rank = parents[:i].count(parent)
        path = DraftTree(tokens, parents[:i]).row_histories()[1 + parent]
        tokens.append(int(row_logits(DRAFT, path).argsort(descending=True, stable=True)[rank]))
    return DraftTree(tokens, parents)


def conditionals(params: dict) -> dict[tuple[int, ...], torch.Tensor]:
    """Exact warped target law [VOCAB] (float64) after every path shorter than TOKENS."""
    out: dict[tuple[int, ...], torch.Tensor] = {}
    frontier: list[tuple[int, ...]] = [()]
    for _ in range(TOKENS):
        for h in frontier:
            out[h] = warp(row_logits(TARGET, h)[None], tensors(params, [h], VOCAB))[0].double()
        frontier = [(*h, x) for h in frontier for x in VOCABULARY]
    return out


def first_tokens(
    params: dict, parents: list[int], n: int, seed: int, warp_paths: bool = True,
    keyed: bool = False,
) -> Counter:  # fmt: skip
    """Counts of the first TOKENS tokens of n trials: verify_tree's, then exact target draws.
    warp_paths=False warps every row as if its path were empty (wrong when penalties are on);
    keyed: trial i is a seeded request of its own seed (coupled), else all draw from one
    generator (rejection sampling)."""
    t, g = draft_tree(parents), seeded(seed)
    histories = t.row_histories()
    logits = torch.stack([row_logits(TARGET, h) for h in histories]).repeat(n, 1)  # [n rows, V]
    warped = histories if warp_paths else [[]] * len(histories)
    keys = [NoiseKey(seed * n + i, 0) if keyed else None for i in range(n)]
    v = verify_tree(logits, [t] * n, tensors(params, warped * n, VOCAB), keys, g)
    law = conditionals(params)
    counts: Counter = Counter()
    for ids in v.token_ids:
        out = ids[:TOKENS]
        while len(out) < TOKENS:
            out.append(int(torch.multinomial(law[tuple(out)], 1, generator=g)))
        counts[tuple(out)] += 1
    return counts


def fits(params: dict, counts: Counter) -> list[Fit]:
    """Goodness of fit of the first 2 and the first 3 tokens against their exact joint law."""
    law, out = conditionals(params), []
    for k in (2, TOKENS):
        joint = {(): 1.0}
        for _ in range(k):
            joint = {(*h, x): pr * float(law[h][x]) for h, pr in joint.items() for x in VOCABULARY}
        marginal = Counter({cell: 0 for cell in joint})
        for cell, c in counts.items():
            marginal[cell[:k]] += c
        out.append(fit(list(joint.values()), [marginal[cell] for cell in joint]))
    return out


def check_exact(case: str, n: int, keyed: bool) -> None:
    params, parents = CASES[case]
    for result in fits(params, first_tokens(params, parents, n, seed=len(case), keyed=keyed)):
        assert result.ok(ALPHA), f"{case}: {result}"


@pytest.mark.parametrize("keyed", [False, True], ids=["unseeded", "seeded"])
@pytest.mark.parametrize("case", CASES)
def test_tree_sampling_is_exact(case: str, keyed: bool) -> None:
    """2000 trials per case: about 5 per cell of the 3-token law, bounded for CI. Unseeded
    trials verify by recursive rejection, seeded ones (a seed each) by the coupled walk."""
    check_exact(case, 2000, keyed)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("VERISPEC_FULL") != "1", reason="set VERISPEC_FULL=1")
@pytest.mark.parametrize("keyed", [False, True], ids=["unseeded", "seeded"])
@pytest.mark.parametrize("case", CASES)
def test_tree_sampling_is_exact_long(case: str, keyed: bool) -> None:
    check_exact(case, 40_000, keyed)


@pytest.mark.parametrize("case", ["t1.0-star", "t0.7-top_p0.9-two-level"])
def test_keeping_rejected_siblings_fails_the_same_check(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verifier whose residual still holds the rejected token over-emits it: caught."""
    monkeypatch.setattr(tree, "_reject_sibling", lambda p, token: p)
    params, parents = CASES[case]
    results = fits(params, first_tokens(params, parents, 2000, seed=len(case)))
    assert all(r.p_value < 1e-9 and not r.ok(ALPHA) for r in results), results


@pytest.mark.parametrize("case", ["t1.0-star", "t1.0-top_k3-unbalanced"])
def test_reusing_the_roots_noise_at_every_depth_fails_the_same_check(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A seeded walk must race each row with the noise of its own output position: one that
    races every depth with the root's noise makes the tokens of a path depend on each other."""
    monkeypatch.setattr(NoiseKey, "shifted", lambda key, offset: key)
    params, parents = CASES[case]
    results = fits(params, first_tokens(params, parents, 2000, seed=len(case), keyed=True))
    assert any(r.p_value < 1e-9 and not r.ok(ALPHA) for r in results), results


def test_warping_rows_without_their_path_fails_the_same_check() -> None:
    """With penalties, a row must be warped with its path's tokens (row_histories): rows that
    forget them give the third token the wrong law, which the 3-token check catches."""
    case = "penalties-see-the-path-two-level"
    params, parents = CASES[case]
    counts = first_tokens(params, parents, 2000, seed=len(case), warp_paths=False)
    assert fits(params, counts)[1].p_value < 1e-9
