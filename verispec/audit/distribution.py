"""The target's exact distribution of the first two generated tokens after a prompt, computed
with the target's own forward and `warp` (the function sampling uses), for `verispec verify`.

p(t1) is the prompt's last row. p(t2 | t1) for many t1 at once is one forward over the cached
prompt with every t1 as a depth-1 node of a draft tree (each node sees the prompt and itself,
at the position after the prompt: docs/design.md, 3, "Draft trees"), so its row is exactly the
distribution after prompt + t1, as plain decoding would compute it (bit for bit in
batch-invariant mode; within float rounding otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from verispec.models.paged import PagedModel, append_chunk
from verispec.sample import SamplingTensors, warp
from verispec.types.sampling_params import SamplingParams

NODES_PER_FORWARD = 64
"""First tokens scored per forward (64 rows of vocabulary-wide logits at a time)."""


@dataclass(frozen=True)
class WarpedRow:
    """One position's warped distribution, and how far each excluded token fell short."""

    probs: np.ndarray  # [vocab] float64, sums to 1
    gap: np.ndarray
    """[vocab] float32: the raw logit of the least likely token top-k/top-p kept, minus this
    token's raw logit, for the tokens they removed (0 for kept tokens): a sample in a removed
    token within float rounding of the boundary (gap <= tolerance) is a near tie, not an error."""


def row_of(logits: torch.Tensor, probs: torch.Tensor) -> WarpedRow:
    """A WarpedRow from one raw logits row [vocab] and its warped probs [vocab].

    >>> r = row_of(torch.tensor([3.0, 2.0, 1.0]), torch.tensor([0.6, 0.4, 0.0]))
    >>> r.gap.tolist()
    [0.0, 0.0, 1.0]
    """
    kept = probs > 0  # [vocab]
    floor = logits[kept].min()
    gap = torch.where(kept, torch.zeros_like(logits), (floor - logits).clamp(min=0))
    return WarpedRow(probs.double().cpu().numpy(), gap.float().cpu().numpy())


class TargetProbe:
    """Forwards of the target after one prompt (its KV computed once, in the target's own
    cache; use while the engine is idle, and close to free the blocks)."""

    def __init__(self, target: PagedModel, prompt: Sequence[int], params: SamplingParams) -> None:
        self.target = target
        self.prompt = list(prompt)
        self.params = replace(params, seed=None)  # warping ignores the seed
        self.table = target.new_table()
        try:
            logits = target.forward([append_chunk(self.table, self.prompt)])  # [1, vocab]
        except BaseException:
            self.table.free()
            raise
        self.first = self._rows(logits, [[]])[0]
        """p(t1): the distribution of the first generated token."""

    def second(self, first_tokens: Sequence[int]) -> dict[int, WarpedRow]:
        """p(t2 | t1) for each t1 in first_tokens: depth-1 tree nodes over the cached prompt."""
        out: dict[int, WarpedRow] = {}
        tokens = sorted(set(first_tokens))
        start = len(self.prompt)
        for i in range(0, len(tokens), NODES_PER_FORWARD):
            group = tokens[i : i + NODES_PER_FORWARD]
            g = len(group)
            chunk = append_chunk(self.table, group, num_logits=g,
                                 extra_mask=torch.eye(g, dtype=torch.bool),
                                 positions=[start] * g)  # fmt: skip
            try:
                logits = self.target.forward([chunk])  # [g, vocab]
            finally:
                self.table.truncate(start)
            out.update(zip(group, self._rows(logits, [[t] for t in group]), strict=True))
        return out

    def _rows(self, logits: torch.Tensor, outputs: list[list[int]]) -> list[WarpedRow]:
        """Warp each logits row as the engine warps a request with those outputs so far."""
        n, vocab = logits.shape
        t = SamplingTensors.build([self.params] * n, [self.prompt] * n, outputs, vocab,
                                  logits.device)  # fmt: skip
        probs = warp(logits, t)  # [n, vocab]
        return [row_of(logits[j].float(), probs[j]) for j in range(n)]

    def close(self) -> None:
        self.table.free()

    def __enter__(self) -> TargetProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
