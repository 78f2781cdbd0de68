"""StepDrafts: one step's drafts as a value the proposer stage hands the runner, the verifier
and the update, one entry per scheduled chunk (no drafts for a prefill chunk)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from verispec.engine.drafter import Drafts, Proposer
from verispec.engine.request import AfterForced, Request
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
    num_forced: list[int] | None = None
    """Per chunk: how many of its first drafts its grammar forced (free to draft, verified like
    the others); None = none anywhere."""

    @classmethod
    def none(cls, num_chunks: int) -> StepDrafts:
        """A step without drafts (plain decoding, prefill chunks, no drafter)."""
        return cls([[] for _ in range(num_chunks)], [None] * num_chunks)

    @classmethod
    def placed(cls, num_chunks: int, chunks: Sequence[int], drafts: Drafts,
               token_ids: Sequence[list[int]],
               num_forced: Sequence[int] | None = None) -> StepDrafts:  # fmt: skip
        """A proposer's drafts (token_ids: its drafts.token_ids, perhaps trimmed; num_forced:
        how many of each lead forced) for the chunks at these plan indices; the other chunks
        get none."""
        ids: list[list[int]] = [[] for _ in range(num_chunks)]
        trees: list[DraftTree | None] = [None] * num_chunks
        forced = [0] * num_chunks
        for n, i in enumerate(chunks):
            ids[i] = token_ids[n]
            trees[i] = None if drafts.trees is None else drafts.trees[n]
            forced[i] = 0 if num_forced is None else min(num_forced[n], len(ids[i]))
        return cls(ids, trees, drafts.probs, forced if any(forced) else None)

    def forced(self, chunks: Sequence[int]) -> list[int]:
        """How many forced drafts lead each chunk's at these plan indices."""
        return [0 if self.num_forced is None else self.num_forced[i] for i in chunks]

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


def propose_after_forced(
    proposer: Proposer, continues: bool, requests: Sequence[Request],
    forced: Sequence[list[int]], slots: Sequence[int],
) -> Drafts:  # fmt: skip
    """Each request's drafts: its forced tokens, then the proposer's for its other slots,
    drafted after them (an AfterForced history) when the proposer continues forced drafts
    (`continues`), else only for requests with none forced."""
    asked = [n for n, (f, k) in enumerate(zip(forced, slots, strict=True))
             if k > len(f) and (continues or not f)]  # fmt: skip
    own = None
    if asked:
        histories = [AfterForced(requests[n], forced[n]) if forced[n] else requests[n]
                     for n in asked]  # fmt: skip
        own = proposer.propose(histories, [slots[n] - len(forced[n]) for n in asked])
    return after_forced(forced, asked, own)


def after_forced(
    forced: Sequence[list[int]], asked: Sequence[int], drafts: Drafts | None
) -> Drafts:
    """Each request's forced tokens followed by the drafter's drafts for the requests it was
    asked about (indices `asked`, in drafts' order), as one Drafts: a chain is joined on, a tree
    hangs below the forced chain's last node, and q is one-hot at each forced token.

    Worked example: forced [[7, 8], []], the drafter asked about request 1 only and drafting
    [[4, 5]] -> token_ids [[7, 8], [4, 5]]; with the tree [4, 5] / parents [-1, -1] for it,
    request 0's tree is the chain 7 -> 8 (parents [-1, 0]).
    """
    n = len(forced)
    if drafts is not None and len(asked) == n and not any(forced):
        return drafts
    ids = [list(f) for f in forced]
    drafted: list[list[int]] = [[] for _ in range(n)]
    if drafts is not None:
        for j, i in enumerate(asked):
            drafted[i] = drafts.token_ids[j]
            ids[i] += drafted[i]
    trees = None
    if drafts is not None and drafts.trees is not None:
        own = dict(zip(asked, drafts.trees, strict=True))
        trees = [_below_chain(forced[i], own.get(i)) for i in range(n)]
    probs = None
    if drafts is not None and drafts.probs is not None:  # [total drafts, vocab]
        q = drafts.probs
        own = dict(zip(asked, torch.split(q, [len(d) for d in drafts.token_ids]), strict=True))
        rows = []
        for i, f in enumerate(forced):
            if f:  # [len(f), vocab] one-hot at each forced token
                one_hot = torch.nn.functional.one_hot(torch.tensor(f, device=q.device), q.shape[1])
                rows.append(one_hot.to(q.dtype))
            if i in own:
                rows.append(own[i])
        probs = torch.cat(rows) if rows else q
    return Drafts(ids, probs, trees)


def _below_chain(chain: list[int], tree: DraftTree | None) -> DraftTree:
    """The chain's tokens as a path from the root, with `tree` (if any) hung below its end.

    >>> _below_chain([7, 8], DraftTree([4, 5], [-1, 0])).parents
    [-1, 0, 1, 2]
    """
    parents = list(range(-1, len(chain) - 1))
    if tree is None:
        return DraftTree(list(chain), parents)
    shift = len(chain)
    return DraftTree(list(chain) + tree.token_ids,
                     parents + [p + shift if p >= 0 else shift - 1 for p in tree.parents])
