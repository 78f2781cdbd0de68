"""Medusa proposer: K heads on the target's last hidden state propose a static tree.

After the target verifies position t (and samples token t + 1), head i's top candidates guess
token t + 2 + i. The tree is fixed by (tree_topk, depth, budget): a path picks one rank per
depth, node (r_1, .., r_d) holds head d's r_d-th most probable token, and the `budget` paths
of highest prior weight prod_d 1 / (r_d + 1) (ties: shallower, then lower ranks), closed
under prefixes, form the tree (Medusa ships hand-tuned trees of this kind). Nodes are
deterministic drafts, verified by the tree verifier (sample/tree.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from verispec.drafters.eagle import check_topk
from verispec.engine.drafter import Drafts
from verispec.engine.request import TokenHistory
from verispec.models.medusa import MedusaHeads
from verispec.sample.tree import DraftTree


def static_tree(topk: int, depth: int, budget: int) -> list[tuple[int, ...]]:
    """Rank paths of the static tree, parents before children.

    Example: static_tree(2, 2, 4) -> [(0,), (1,), (0, 0), (0, 1)]: weights 1, 1/2, 1, 1/2
    by prod 1 / (rank + 1); (0, 0) and (0,) tie at 1 and the shallower comes first.
    """
    if min(topk, depth, budget) < 1:
        raise ValueError(f"topk, depth and budget must be >= 1, got {topk}, {depth}, {budget}")
    paths = [p for d in range(1, depth + 1) for p in itertools.product(range(topk), repeat=d)]

    def weight(path: tuple[int, ...]) -> float:
        return math.prod(1 / (r + 1) for r in path)

    chosen: list[tuple[int, ...]] = []
    for path in sorted(paths, key=lambda p: (-weight(p), len(p), p)):
        if len(chosen) == budget:
            break
        if len(path) == 1 or path[:-1] in chosen:
            chosen.append(path)
    return sorted(chosen, key=lambda p: (len(p), p))


@dataclass(slots=True)
class _Last:
    """The newest target feature of a request and how many positions were observed."""

    feature: torch.Tensor | None = None
    observed: int = 0


class MedusaProposer:
    """Drafts a static tree per request from its last verified position's hidden state."""

    def __init__(self, heads: MedusaHeads, budget: int, topk: int, depth: int) -> None:
        check_topk(topk, heads.config.draft_vocab_size)
        self.heads = heads
        self.depth = min(depth, heads.config.num_heads)
        """Levels drafted: one per head at most (a deeper tree_depth is cut to the heads)."""
        self.topk = topk
        self.budget = budget
        self.paths = static_tree(topk, self.depth, budget)
        self.states: dict[str, _Last] = {}

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return (self.heads.feature_layer,)

    def observe(self, request: TokenHistory, start: int, features: torch.Tensor) -> None:
        """Keep the last of the kept positions' features [n, hidden]."""
        state = self.states.get(request.request_id)
        if state is None or start == 0:  # a prefix cache hit may start after position 0
            state = self.states[request.request_id] = _Last(observed=start)
        if start != state.observed:
            raise RuntimeError(f"Medusa got features of position {start} for request "
                               f"{request.request_id}, expected {state.observed}")  # fmt: skip
        state.feature = features[-1]
        state.observed += len(features)

    def release(self, request: TokenHistory) -> None:
        self.states.pop(request.request_id, None)

    @property
    def reads_every_position(self) -> bool:
        """False: the heads read only the last position's features."""
        return False

    def propose(self, requests: Sequence[TokenHistory], num_tokens: Sequence[int]) -> Drafts:
        """The static tree cut to num_tokens[i] nodes, filled with each head's top tokens."""
        hidden = torch.stack([self._feature(r) for r in requests])  # [n, hidden]
        logits = self.heads.logits(hidden, self.depth)  # [depth, n, draft vocab]
        top = self.heads.draft_to_target[logits.topk(self.topk, dim=-1).indices]
        ranked = top.tolist()  # [depth][n][topk] target ids
        trees = [self._tree([ranked[d][i] for d in range(self.depth)], k)
                 for i, k in enumerate(num_tokens)]  # fmt: skip
        return Drafts(token_ids=[t.token_ids for t in trees], probs=None, trees=trees)

    def _feature(self, request: TokenHistory) -> torch.Tensor:
        state = self.states.get(request.request_id)
        if state is None or state.feature is None or state.observed != request.num_tokens - 1:
            raise RuntimeError(f"Medusa lacks the last hidden state of request "
                               f"{request.request_id}")  # fmt: skip
        return state.feature

    def _tree(self, ranked: list[list[int]], budget: int) -> DraftTree:
        """The first `budget` paths (parents come first, so any prefix is a tree)."""
        index: dict[tuple[int, ...], int] = {}
        tokens, parents = [], []
        for path in self.paths[: max(0, budget)]:
            index[path] = len(tokens)
            tokens.append(ranked[len(path) - 1][path[-1]])
            parents.append(index[path[:-1]] if len(path) > 1 else -1)
        return DraftTree(tokens, parents)
