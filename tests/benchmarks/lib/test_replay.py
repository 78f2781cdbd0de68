"""Replays of model-free drafters on recorded outputs (benchmarks/lib/replay.py): greedy
acceptance of a tree, step counts against hand-worked cases, drafters learning from earlier
outputs, the copy bound above every replayed drafter on random sequences, and the end-to-end
ceiling."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.lib.replay import (
    Recorded,
    copy_bound,
    end_to_end_ceiling,
    greedy_accepted,
    replay,
)
from verispec import SpecConfig
from verispec.drafters.registry import make_model_free_proposer
from verispec.engine.drafter import Proposer
from verispec.sample.tree import DraftTree


def proposer(method: str, k: int) -> Proposer:
    return make_model_free_proposer(SpecConfig(method=method, num_speculative_tokens=k))


def test_greedy_accepted_walks_the_agreeing_path() -> None:
    tree = DraftTree([5, 7, 2, 9], [-1, -1, 0, 0])
    assert greedy_accepted(tree, [5, 9, 4]) == 2
    assert greedy_accepted(tree, [7, 2]) == 1  # 2 hangs below 5, not 7
    assert greedy_accepted(tree, [3]) == 0
    assert greedy_accepted(DraftTree([], []), [1, 2]) == 0
    assert greedy_accepted(DraftTree.chain([1, 2, 3]), [1, 2]) == 2  # truth ends first


def test_replay_counts_steps_as_the_engine_takes_them() -> None:
    # Nothing to copy: every step emits one token (the prefill emitted the first).
    stats = replay(proposer("ngram", 4), [Recorded([1, 2, 3], [4, 5, 6, 7])], 4)
    assert (stats.steps, stats.tokens, stats.verify_steps) == (3, 3, 0)
    assert stats.tokens_per_step == 1.0
    # The prompt holds the output after [8, 9]: the first step's lookup of [8, 9] drafts 10 to
    # 13, all accepted, plus the target's 14; the last token, 15, leaves no room for drafts.
    prompt, output = [8, 9, 10, 11, 12, 13, 14, 15, 8], [9, 10, 11, 12, 13, 14, 15]
    stats = replay(proposer("ngram", 4), [Recorded(prompt, output)], 4)
    assert (stats.steps, stats.tokens, stats.verify_steps, stats.accepted) == (2, 6, 1, 4)
    assert stats.mean_length == 5.0 and stats.tokens_per_step == 3.0


def test_suffix_drafts_from_earlier_outputs_and_ngram_does_not() -> None:
    output = [20, 21, 22, 23, 24, 25, 26, 27, 28, 29]
    recorded = [Recorded([1, 2], output), Recorded([3, 4], output)]
    suffix = replay(proposer("suffix", 8), recorded, 8)
    ngram = replay(proposer("ngram", 8), recorded, 8)
    alone = replay(proposer("suffix", 8), recorded[1:], 8)
    assert ngram.steps == 18 and alone.steps == 9  # nothing repeats within a request
    assert suffix.steps < 18  # the second request copies the first's output


sequences = st.lists(st.integers(0, 3), min_size=2, max_size=30)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(sequences, sequences), min_size=1, max_size=3), st.integers(1, 6))
def test_copy_bound_is_above_every_model_free_drafter(
    rows: list[tuple[list[int], list[int]]], k: int
) -> None:
    recorded = [Recorded(p, o) for p, o in rows]
    bound = copy_bound(recorded, k)
    assert bound.tokens == sum(len(o) - 1 for _, o in rows)
    for method in ("ngram", "suffix"):
        stats = replay(proposer(method, k), recorded, k)
        assert stats.tokens == bound.tokens
        assert stats.steps >= bound.steps, method


def test_copy_bound_hand_worked() -> None:
    # After [1, 2, 1] comes [3, 4]: the 1 at 0 was followed by 2, so nothing is copied.
    assert copy_bound([Recorded([1, 2], [1, 3, 4])], 4).accepted == 0
    # After [1, 2, 3, 1] comes [2, 3, 9]: the 1 at 0 was followed by 2, 3, both copied (the
    # last token is the target's own), so one step emits all three.
    stats = copy_bound([Recorded([1, 2, 3], [1, 2, 3, 9])], 4)
    assert (stats.steps, stats.tokens, stats.accepted) == (1, 3, 2)


def test_end_to_end_ceiling_and_model_free_methods_only() -> None:
    assert end_to_end_ceiling(3.0, 0.25, 1.0) == pytest.approx(1.25 / (0.25 + 1 / 3))
    assert end_to_end_ceiling(1.0, 0.5, 2.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="model-free methods: \\['ngram', 'suffix'\\]"):
        make_model_free_proposer(SpecConfig(method="draft_model", model="draft/"))
