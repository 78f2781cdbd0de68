"""StepDrafts: one step's drafts as a value the proposer stage hands the runner, the verifier
and the update, one entry per scheduled chunk (no drafts for a prefill chunk)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from verispec.engine.drafter import Drafts
from verispec.engine.request import Request
from verispec.sample.tree import DraftTree


@dataclass(slots=True, frozen=True)
class StepDrafts:
    """The drafts of one step's scheduled chunks, in plan order.

    Worked example: chunks [prefill, decode with drafts [7, 8], decode without] ->
    token_ids [[], [7, 8], []], trees [None, None, None], probs None (deterministic drafts).
    """

    token_ids: list[list[int]]
    """Per chunk: the draft tokens it verifies after its own tokens (at most its slots)."""
    trees: list[DraftTree | None]
    """Per chunk: the tree its drafts form (nodes in token_ids order); None = a chain."""
    probs: torch.Tensor | None = None
    """[total drafts, vocab] the drafter's warped q at each draft, rows in plan order; None for
    deterministic drafts (q one-hot at the draft token)."""

    @classmethod
    def none(cls, num_chunks: int) -> StepDrafts:
        """A step without drafts (plain decoding, prefill chunks, no drafter)."""
        return cls([[] for _ in range(num_chunks)], [None] * num_chunks)

    @classmethod
    def placed(cls, num_chunks: int, chunks: Sequence[int], drafts: Drafts,
               token_ids: Sequence[list[int]]) -> StepDrafts:  # fmt: skip
        """A proposer's drafts (token_ids: its drafts.token_ids, perhaps trimmed) for the chunks
        at these plan indices; the other chunks get none."""
        ids: list[list[int]] = [[] for _ in range(num_chunks)]
        trees: list[DraftTree | None] = [None] * num_chunks
        for n, i in enumerate(chunks):
            ids[i] = token_ids[n]
            trees[i] = None if drafts.trees is None else drafts.trees[n]
        return cls(ids, trees, drafts.probs)

    def rows(self, chunks: Sequence[int]) -> list[list[int]]:
        """The draft tokens of the chunks at these plan indices (e.g. Schedule.sampled)."""
        return [self.token_ids[i] for i in chunks]

    def tree_rows(self, chunks: Sequence[int]) -> list[DraftTree | None]:
        """The trees of the chunks at these plan indices (None = a chain)."""
        return [self.trees[i] for i in chunks]

    @property
    def has_trees(self) -> bool:
        return any(t is not None for t in self.trees)


def trim_to_grammar(requests: Sequence[Request], drafts: Drafts) -> list[list[int]]:
    """Each request's drafts, deterministic chains cut before the first token its grammar
    forbids: the masked target could never accept it. Sampled drafts come from a masked q, and
    a tree's nodes are no sequence, so those stay whole."""
    if drafts.trees is not None or drafts.probs is not None:
        return drafts.token_ids
    return [ids if r.grammar is None else ids[: r.grammar.valid_prefix(ids)]
            for r, ids in zip(requests, drafts.token_ids, strict=True)]  # fmt: skip
