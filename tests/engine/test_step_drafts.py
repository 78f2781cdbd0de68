"""StepDrafts: a proposer's drafts placed at their chunks of the plan, and trimmed to a grammar
only where the drafts are deterministic chains."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from verispec.engine.drafter import Drafts
from verispec.engine.step_drafts import StepDrafts, after_forced, trim_to_grammar
from verispec.sample.tree import DraftTree


def test_drafts_are_placed_at_their_chunks() -> None:
    drafts = Drafts([[7, 8], [9]], None)
    placed = StepDrafts.placed(4, [1, 3], drafts, drafts.token_ids)
    assert placed.token_ids == [[], [7, 8], [], [9]]
    assert placed.trees == [None] * 4 and placed.probs is None and not placed.has_trees
    assert placed.rows([1, 2]) == [[7, 8], []]
    tree = DraftTree([5, 6], [-1, -1])
    q = torch.zeros(2, 3)
    with_tree = StepDrafts.placed(2, [0], Drafts([[5, 6]], q, [tree]), [[5, 6]])
    assert with_tree.trees == [tree, None] and with_tree.has_trees and with_tree.probs is q
    assert with_tree.tree_rows([0, 1]) == [tree, None]
    assert StepDrafts.none(2) == StepDrafts([[], []], [None, None])


def test_only_deterministic_chains_are_trimmed_to_a_grammar() -> None:
    grammar = SimpleNamespace(valid_prefix=lambda ids: 1)  # accepts one token of any drafts
    constrained, free = SimpleNamespace(grammar=grammar), SimpleNamespace(grammar=None)
    chains = Drafts([[1, 2, 3], [4, 5]], None)
    assert trim_to_grammar([constrained, free], chains) == [[1], [4, 5]]  # type: ignore[list-item]
    sampled = Drafts([[1, 2, 3]], torch.zeros(3, 8))
    assert trim_to_grammar([constrained], sampled) == [[1, 2, 3]]  # type: ignore[list-item]
    tree = Drafts([[1, 2]], None, [DraftTree([1, 2], [-1, -1])])
    assert trim_to_grammar([constrained], tree) == [[1, 2]]  # type: ignore[list-item]


def test_forced_tokens_lead_each_requests_drafts() -> None:
    """after_forced: the worked example, chains joined, q one-hot at forced tokens."""
    joined = after_forced([[7, 8], []], [1], Drafts([[4, 5]], None))
    assert joined.token_ids == [[7, 8], [4, 5]] and joined.probs is None and joined.trees is None
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0, 0.0, 0.0]])  # [1 draft, vocab 6]
    sampled = after_forced([[2], [3, 1]], [0], Drafts([[0]], q))
    assert sampled.token_ids == [[2, 0], [3, 1]]
    expected = torch.zeros(4, 6)
    expected[0, 2] = expected[2, 3] = expected[3, 1] = 1
    expected[1] = q[0]
    assert torch.equal(sampled.probs, expected)
    assert after_forced([[9]], [], None) == Drafts([[9]], None, None)
    unchanged = Drafts([[1, 2]], q)
    assert after_forced([[]], [0], unchanged) is unchanged


def test_a_drafters_tree_hangs_below_the_forced_chain() -> None:
    tree = DraftTree([4, 5, 6], [-1, -1, 0])
    joined = after_forced([[7, 8], [9]], [0], Drafts([[4, 5, 6]], None, [tree]))
    assert joined.token_ids == [[7, 8, 4, 5, 6], [9]]
    assert joined.trees is not None
    assert joined.trees[0].parents == [-1, 0, 1, 1, 2]
    assert joined.trees[1] == DraftTree([9], [-1])


def test_forced_counts_are_placed_with_the_drafts() -> None:
    drafts = Drafts([[7, 8, 4], [9]], None)
    placed = StepDrafts.placed(3, [0, 2], drafts, [[7, 8], [9]], [2, 1])
    assert placed.forced([0, 1, 2]) == [2, 0, 1]
    assert StepDrafts.placed(1, [0], drafts, [[7]], [0]).num_forced is None
    assert StepDrafts.none(2).forced([0, 1]) == [0, 0]
