"""Draft trees and their lossless verifier: many candidate continuations checked in one forward.

A drafter (EAGLE, Medusa) proposes a tree of tokens rooted at the request's last committed
token; the target scores every node in one forward with a tree attention mask, and
`verify_tree` keeps the longest path it would itself have produced (docs/design.md, 3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from verispec.sample.logits import SamplingTensors, apply_mask, warp
from verispec.sample.noise import NoiseKey
from verispec.sample.rejection import Verdict
from verispec.sample.sampler import argmax_rows, sample


@dataclass(slots=True)
class DraftTree:
    """Draft tokens in topological order: node i holds token_ids[i] and hangs below parents[i]
    (-1 = the root, the request's last committed token, which the target scores in row 0).

    Example: token_ids [5, 7, 2, 9], parents [-1, -1, 0, 0] is the root with children 5 and 7,
    and 5 with children 2 and 9: depths [1, 1, 2, 2], path(3) = [0, 3] (tokens 5, 9).
    """

    token_ids: list[int]
    parents: list[int]

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.parents):
            raise ValueError(
                f"token_ids and parents need one entry per node, got {len(self.token_ids)} "
                f"and {len(self.parents)}"
            )
        self.token_ids, self.parents = list(self.token_ids), list(self.parents)
        seen: set[tuple[int, int]] = set()
        for i, (token, parent) in enumerate(zip(self.token_ids, self.parents, strict=True)):
            if not -1 <= parent < i:
                raise ValueError(
                    f"parents[{i}] must be -1 (the root) or an earlier node in [0, {i}), "
                    f"got {parent}"
                )
            if token < 0:
                raise ValueError(f"token_ids must be >= 0, got {token} at node {i}")
            if (parent, token) in seen:
                raise ValueError(f"node {i} repeats token {token} of a sibling under {parent}")
            seen.add((parent, token))

    @classmethod
    def chain(cls, token_ids: Sequence[int]) -> DraftTree:
        """A tree of width 1: chain([4, 8]) has parents [-1, 0]."""
        return cls(list(token_ids), list(range(-1, len(token_ids) - 1)))

    def graft(self, chain: Sequence[int]) -> DraftTree:
        """This tree with the path `chain` (tokens from the root down) added: the chain follows
        existing nodes while their tokens match and appends the rest below the last match, so
        siblings stay distinct. E.g. token_ids [5, 7, 2], parents [-1, -1, 0] grafted with
        [5, 3, 8] gives token_ids [5, 7, 2, 3, 8], parents [-1, -1, 0, 0, 3]."""
        tokens, parents = list(self.token_ids), list(self.parents)
        node = -1
        for token in chain:
            match = next((i for i in range(len(tokens))
                          if parents[i] == node and tokens[i] == token), None)  # fmt: skip
            if match is None:
                tokens.append(token)
                parents.append(node)
                match = len(tokens) - 1
            node = match
        return DraftTree(tokens, parents)

    @property
    def num_nodes(self) -> int:
        """Draft nodes, not counting the root."""
        return len(self.token_ids)

    def depths(self) -> list[int]:
        """Depth of each node, the root's children at 1: parents [-1, 0, -1] -> [1, 2, 1]."""
        out: list[int] = []
        for parent in self.parents:
            out.append(1 if parent < 0 else out[parent] + 1)
        return out

    def path(self, node: int) -> list[int]:
        """Nodes from depth 1 down to `node`. parents [-1, 0, 1, 0]: path(2) = [0, 1, 2]."""
        self._check_node(node, allow_root=False)
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def children(self, node: int) -> list[int]:
        """Children of `node` (-1 = the root) in node order. parents [-1, 0, -1]: children(-1)
        = [0, 2], children(0) = [1]."""
        self._check_node(node, allow_root=True)
        return [i for i, parent in enumerate(self.parents) if parent == node]

    def attention_mask(self) -> torch.Tensor:
        """[N + 1, N + 1] bool, row and column 0 the root, 1 + i node i: True where a row may
        attend (itself, the root, its ancestors); the verify forward's `SeqChunk.extra_mask`.

        Example: parents [-1, -1, 0] gives rows [1 0 0 0], [1 1 0 0], [1 0 1 0], [1 1 0 1].
        """
        n = self.num_nodes
        mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)  # [N + 1, N + 1]
        mask[:, 0] = True
        for i, parent in enumerate(self.parents):
            mask[1 + i] |= mask[1 + parent]  # the root's row when parent is -1
            mask[1 + i, 1 + i] = True
        return mask

    def positions(self, start: int) -> list[int]:
        """Rotary positions of the root and nodes: start, then start + depth.
        parents [-1, -1, 0] with start 10 -> [10, 11, 11, 12]."""
        return [start, *(start + d for d in self.depths())]

    def row_histories(self) -> list[list[int]]:
        """Draft tokens on the path to each of the N + 1 rows ([] for the root's row), which
        the caller appends to a request's output when warping that row (penalties see them).
        token_ids [5, 7, 2], parents [-1, -1, 0] -> [[], [5], [7], [5, 2]]."""
        rows: list[list[int]] = [[]]
        for token, parent in zip(self.token_ids, self.parents, strict=True):
            rows.append([*rows[1 + parent], token])
        return rows

    def _check_node(self, node: int, allow_root: bool) -> None:
        """A clear error for a node index outside the tree."""
        low = -1 if allow_root else 0
        if not low <= node < self.num_nodes:
            raise ValueError(f"node must be in [{low}, {self.num_nodes}), got {node}")


def _reject_sibling(p: torch.Tensor, token: int) -> torch.Tensor:
    """[vocab] the residual norm(max(0, p - q)) after rejecting a point-mass draft q at `token`:
    p with `token` zeroed, renormalised. [0.5, 0.3, 0.2] rejecting 0 -> [0, 0.6, 0.4].
    A point mass p at `token` (never rejected: acceptance has probability 1) stays as it is."""
    residual = p.clone()
    residual[token] = 0.0
    mass = residual.sum()
    return torch.where(mass > 0, residual / mass.clamp(min=1e-30), p)


def verify_tree(
    logits: torch.Tensor,
    trees: Sequence[DraftTree],
    t: SamplingTensors,
    keys: Sequence[NoiseKey | None],
    generator: torch.Generator | None = None,
) -> Verdict:
    """Accept the longest path of each request's draft tree that the target would produce, then
    add one final token; every emitted token follows the target's warped distribution exactly.

    logits [R, vocab]: request r owns trees[r].num_nodes + 1 consecutive rows (row 0 the root,
    row 1 + i the distribution after node i given its path); t has one row per logits row;
    keys: per request, the noise key of its root row (a seeded request) or None (its draws
    from `generator`). A tree without nodes samples plainly.

    Greedy rows descend to the child holding the row's argmax and end with the argmax.
    Seeded rows descend to the child holding the row's own token argmax(p / E), E the noise of
    the row's output position (the root's key shifted by the row's depth), and end with that
    token: plain seeded decoding's tokens, whatever the tree (rejection.py's coupling).
    Other sampled rows use recursive rejection sampling for drafts drawn without replacement
    (Yang et al. 2024, "Multi-Candidate Speculative Decoding"; SpecTr, Sun et al. 2023;
    SpecInfer's multi-step speculative sampling, Miao et al. 2024) with point-mass drafts: at a
    node with distribution p, child c (token x_c, in node order) is accepted with probability
    p(x_c), and on rejection p becomes norm(max(0, p - onehot(x_c))) = p without x_c,
    renormalised. When every child is rejected, the final token is drawn from what is left of p.
    Why exact: with distinct child tokens x_1..x_m, by induction on m the token emitted at the
    node has law p. m = 0: drawn from p. m >= 1: x_1 comes out with probability p(x_1);
    otherwise (probability 1 - p(x_1)) the rest runs on p' = p(y) / (1 - p(x_1)) for y != x_1,
    which by induction it emits exactly, so y != x_1 comes out with probability
    (1 - p(x_1)) p'(y) = p(y). An accepted child's row is the target given that very path, so
    by induction on depth the whole emitted sequence follows target sampling. (It is the same
    as drawing y ~ p and following the child with token y, if any.) This needs distinct sibling
    tokens (DraftTree checks) and a tree fixed before these draws, whatever drafter chose it.
    Worked example (greedy): tree [5, 7, 2, 9] / [-1, -1, 0, 0], row argmaxes [5, 9, 1, 3, 6]:
    root -> 5 (row 0), node 0's row wants 9 = node 3, node 3's row says 6: token_ids [[5, 9, 6]],
    num_accepted [2], paths [[0, 3]].
    """
    starts = _starts(logits, trees, t, keys)
    fast = t.all_greedy and not t.need_penalties  # then only the raw logits' argmax matters
    p = apply_mask(logits, t) if fast else warp(logits, t)  # [R, vocab]
    greedy = [True] * len(p) if fast else t.greedy.tolist()  # [R]
    argmax = argmax_rows(p).tolist() if t.any_greedy else []  # [R] when some row is greedy
    walks = [
        _walk(tree, p, s, greedy, argmax, key, generator)
        for tree, s, key in zip(trees, starts, keys, strict=True)
    ]
    paths = [walk.path for walk in walks]
    finals = [walk.final for walk in walks]
    drawn = [i for i, walk in enumerate(walks) if walk.final is None]  # rejection's last draws
    if drawn:
        flags = torch.tensor([greedy[walks[i].row] for i in drawn], device=p.device)  # [n]
        dists = torch.stack([walks[i].dist for i in drawn])  # [n, vocab]
        tokens = sample(dists, [None] * len(drawn), flags, generator).tolist()  # [n]
        for i, token in zip(drawn, tokens, strict=True):
            finals[i] = token
    token_ids = [
        [*(tree.token_ids[i] for i in path), final]
        for tree, path, final in zip(trees, paths, finals, strict=True)
    ]
    return Verdict(token_ids=token_ids, num_accepted=[len(path) for path in paths], paths=paths)


def _starts(
    logits: torch.Tensor,
    trees: Sequence[DraftTree],
    t: SamplingTensors,
    keys: Sequence[NoiseKey | None],
) -> list[int]:
    """The root row of each request, after checking that the shapes fit together."""
    starts, row = [], 0
    for tree in trees:
        starts.append(row)
        row += tree.num_nodes + 1
    if logits.shape[0] != row or t.temperature.shape[0] != row:
        raise ValueError(
            f"verify_tree needs {row} logits rows and sampling rows (num_nodes + 1 per tree), "
            f"got {logits.shape[0]} and {t.temperature.shape[0]}"
        )
    if len(keys) != len(trees):
        raise ValueError(f"need one noise key per tree ({len(trees)}), got {len(keys)}")
    vocab = logits.shape[1]
    if any(x >= vocab for tree in trees for x in tree.token_ids):
        raise ValueError(f"tree token ids must be below the vocabulary size {vocab}")
    return starts


def _child_lists(tree: DraftTree) -> list[list[int]]:
    """children of node n at index n + 1 (the root's at 0), built in one pass."""
    kids: list[list[int]] = [[] for _ in range(tree.num_nodes + 1)]
    for i, parent in enumerate(tree.parents):
        kids[1 + parent].append(i)
    return kids


@dataclass(slots=True)
class _Walk:
    """One request's way down its tree: the accepted nodes, the last one's row, and the final
    token, or (final None) the distribution [vocab] it is still to be drawn from."""

    path: list[int]
    row: int
    final: int | None
    dist: torch.Tensor | None = None


def _walk(
    tree: DraftTree,
    p: torch.Tensor,
    start: int,
    greedy: list[bool],
    argmax: list[int],
    key: NoiseKey | None,
    generator: torch.Generator | None,
) -> _Walk:
    """One request's walk: greedy rows follow their argmax, seeded rows their own token
    (argmax(p / E) at the row's output position), other sampled rows reject siblings
    recursively and leave the final draw to the caller."""
    kids, path, row = _child_lists(tree), [], start
    while True:
        children = kids[row - start]
        token = argmax[row] if greedy[row] else None
        if token is None and key is not None:  # the row's output position: root + depth
            token = int(sample(p[row][None], [key.shifted(len(path))])[0])
        if token is not None:
            child = next((c for c in children if tree.token_ids[c] == token), None)
            if child is None:
                return _Walk(path, row, token)
        else:
            picked, dist = _accept_child(p[row], [tree.token_ids[c] for c in children], generator)
            if picked is None:
                return _Walk(path, row, None, dist)
            child = children[picked]
        path.append(child)
        row = start + 1 + child


def _accept_child(
    p: torch.Tensor, tokens: list[int], generator: torch.Generator | None
) -> tuple[int | None, torch.Tensor]:
    """(index of the accepted sibling or None, the residual [vocab] after rejecting all of them):
    sibling j is accepted with probability residual_j(x_j), u in (0, 1] from `generator`."""
    residual = p
    chances = []
    for token in tokens:
        chances.append(residual[token])
        residual = _reject_sibling(residual, token)
    if not tokens:
        return None, residual
    u = 1.0 - torch.rand(len(tokens), generator=generator, device=p.device)  # [m] in (0, 1]
    ok = (u <= torch.stack(chances)).tolist()
    return (ok.index(True) if True in ok else None), residual
