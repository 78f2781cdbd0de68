"""Which of the target's layers a self-speculative draft skips, and its k: a short calibration.

Method "self" drafts with the target minus some decoder layers (drafters/self_draft.py). Each
skipped layer makes a draft step cheaper and its guesses worse; the calibration measures both
on a few prompts and keeps the skip set and k of the best expected speedup:

1. Text: the target's own greedy continuation of each prompt (up to num_tokens, ending at EOS).
2. Reference: one teacher-forced forward of the target over prompt + continuation, keeping its
   argmax at every continuation position and the residual stream entering every layer.
3. Agreement of a skip set S: the same forward with S left out, started from the stored stream
   entering S's first layer (the layers before it are unchanged), its argmax compared with the
   target's at every position. At temperature 0 this is what verification checks: a draft is
   accepted when the drafts before it were, i.e. when they were the target's own tokens, and it
   is the target's argmax after them; so runs of agreement are runs of accepted drafts.
4. Expected speedup of (S, k) = tokens per step / step cost in target decode steps:
   (1 + mean_accepted(agreement, k)) / (k * draft(kept) + verify(k)) (RelativeStepCost,
   in spec/cost.py beside the acceptance and step-cost models of the adaptive policy and the
   benchmarks).

Candidates come from two search spaces: early exit (LayerSkip's shape: keep the first N layers,
every N, scored from the stored streams with no further forward) and interleaved skipping
(SWIFT's shape: every single layer, then sets grown greedily, each round adding the best of
the `width` best single skips not yet in the set, until `patience` rounds bring no better
speedup). It is deterministic given the prompts: argmax comparisons and a cost model of weight
sizes, no timings.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from verispec.models.attention import AttentionLayout
from verispec.models.batch import ForwardBatch
from verispec.models.llama import LayerInputs, LlamaModel, decoder_layer, rms_norm
from verispec.models.paged import PagedModel, append_chunk
from verispec.models.rope import rope_cos_sin
from verispec.spec.cost import RelativeStepCost

BLOCK_SIZE = 16


def mean_accepted(agreement: Sequence[Sequence[bool]], k: int) -> float:
    """Mean drafts a chain of k accepts, over every start position of every sequence: the run
    of agreeing positions from there, at most k. Starts whose k positions run past the end of
    their sequence without a disagreement are left out (their run is cut, not ended).

    >>> mean_accepted([[True, True, False, True]], 2)  # runs 2, 1, 0 (the last start is cut)
    1.0
    >>> mean_accepted([[True, True, False, True]], 1), mean_accepted([[False]], 3)
    (0.75, 0.0)
    """
    total, starts = 0, 0
    for agree in agreement:
        n, run = len(agree), 0
        for s in range(n - 1, -1, -1):  # run = agreeing positions from s on
            run = run + 1 if agree[s] else 0
            if s + run < n or s + k <= n:
                total += min(run, k)
                starts += 1
    return total / starts if starts else 0.0


@dataclass(frozen=True, slots=True)
class SkipChoice:
    """A skip set and k for method self, and what the calibration measured for them."""

    skip_layers: tuple[int, ...]
    num_layers: int
    """Decoder layers of the target the choice was made for."""
    num_speculative_tokens: int | None = None
    """The calibrated k; None = SpecConfig.num_speculative_tokens."""
    agreement: float | None = None
    """Share of calibration positions where the draft's argmax was the target's."""
    expected_speedup: float | None = None
    search: str | None = None
    """Search space of the choice: "early exit" or "interleaved"; None = given by the user."""

    def describe(self) -> str:
        """One line: what the draft runs and, when calibrated, why."""
        kept = self.num_layers - len(self.skip_layers)
        line = (f"self-speculation drafts with {kept} of {self.num_layers} layers (skips "
                f"{', '.join(map(str, self.skip_layers))})")  # fmt: skip
        if self.num_speculative_tokens is not None:
            line += f", k={self.num_speculative_tokens}"
        if self.agreement is not None and self.expected_speedup is not None:
            line += (f"; calibrated ({self.search}): the draft agrees with the target at "
                     f"{self.agreement:.0%} of positions, expected speedup "
                     f"{self.expected_speedup:.2f}x")  # fmt: skip
            if self.expected_speedup < 1:
                line += " (below 1: plain decoding is expected to be faster)"
        return line

    def save(self, path: str | Path) -> None:
        """Write the choice as JSON (read back by load)."""
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> SkipChoice:
        """A choice written by save; ValueError naming the file when it is not one."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            choice = cls(**{**data, "skip_layers": tuple(data["skip_layers"])})
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise ValueError(f"self-speculation calibration file {path} cannot be read: {e}; "
                             "delete it to calibrate again") from None  # fmt: skip
        k = choice.num_speculative_tokens
        ints = [choice.num_layers, *choice.skip_layers, *([] if k is None else [k])]
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ints):
            raise ValueError(f"self-speculation calibration file {path} has non-integer "
                             "skip_layers, num_layers or num_speculative_tokens")  # fmt: skip
        return choice


@dataclass(frozen=True, slots=True)
class Candidate:
    """A scored skip set: its agreement and its best k with that k's expected speedup."""

    skip: tuple[int, ...]
    search: str
    agreement: float
    k: int
    speedup: float


class AgreementScorer:
    """The reference forward of step 2, kept to score skip sets (steps 3 and 4)."""

    def __init__(
        self, model: LlamaModel, prompts: Sequence[Sequence[int]], eos: set[int], num_tokens: int
    ) -> None:
        self.model = model
        limit = max(1, model.config.max_position_embeddings - num_tokens)
        prompts = [list(p)[-limit:] for p in prompts]  # room for the continuation
        num_blocks = sum(-(-(len(p) + num_tokens) // BLOCK_SIZE) for p in prompts)
        self.paged = PagedModel(model, num_blocks, BLOCK_SIZE)
        seqs = [p + c for p, c in zip(prompts, self._continue(prompts, eos, num_tokens),
                                      strict=True)]  # fmt: skip
        tables = [self.paged.new_table() for _ in seqs]
        self.counts = [len(s) - len(p) for s, p in zip(seqs, prompts, strict=True)]
        chunks = [append_chunk(t, s[:-1], n) for t, s, n in zip(tables, seqs, self.counts,
                                                                strict=True)]  # fmt: skip
        self.batch = ForwardBatch.build(chunks, BLOCK_SIZE, model.device)
        self.layout = AttentionLayout.build(self.batch, model.windows, model.batch_invariant)
        cos, sin = rope_cos_sin(self.batch.positions, model.inv_freq, model.dtype)
        self.inputs = LayerInputs(self.batch.slot_mapping, self.paged.kv, self.layout, cos, sin)
        final, self.streams = self._stack(self.batch, self.layout, range(len(model.layers) + 1))
        rows = final.index_select(0, self.batch.logits_indices)
        self.reference = model.logits(rows).argmax(dim=1)  # [positions] the target's argmax

    def _stack(
        self, batch: ForwardBatch, layout: AttentionLayout, layers: Sequence[int] = ()
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The eager decoder stack (a compiled target would compile these shapes too)."""
        return self.model.decoder_stack(batch.input_ids, batch.positions, batch.slot_mapping,
                                        layout, self.paged.kv, tuple(layers))  # fmt: skip

    def _continue(
        self, prompts: list[list[int]], eos: set[int], num_tokens: int
    ) -> list[list[int]]:
        """Step 1: each prompt's greedy continuation, decoded in one batch."""
        tables = [self.paged.new_table() for _ in prompts]
        outs: list[list[int]] = [[] for _ in prompts]
        live, feed = list(range(len(prompts))), [list(p) for p in prompts]
        while live:
            batch = ForwardBatch.build([append_chunk(tables[i], feed[i]) for i in live],
                                       BLOCK_SIZE, self.model.device)  # fmt: skip
            final, _ = self._stack(batch, AttentionLayout.build(
                batch, self.model.windows, self.model.batch_invariant))  # fmt: skip
            tokens = self.model.logits(final.index_select(0, batch.logits_indices)).argmax(1)
            for i, token in zip(live, tokens.tolist(), strict=True):
                outs[i].append(token)
                feed[i] = [token]
            live = [i for i in live if len(outs[i]) < num_tokens and outs[i][-1] not in eos]
        for table in tables:
            table.free()
        return outs

    def agreement(self, skip: Sequence[int]) -> list[list[bool]]:
        """Per sequence, whether the model without `skip` has the target's argmax at each
        continuation position (an early exit when skip is every layer from some N on)."""
        first, skipped = min(skip), set(skip)
        x = self.streams[first]  # [T, hidden] entering layer `first`, as in the target
        b, m = self.batch, self.model
        for i in range(first, len(m.layers)):
            if i not in skipped:
                x = decoder_layer(m.config, i, m.layers[i], x, self.inputs)
        rows = rms_norm(x.index_select(0, b.logits_indices), m.final_norm, m.config.rms_norm_eps)
        same = (m.logits(rows).argmax(dim=1) == self.reference).tolist()
        out, at = [], 0
        for n in self.counts:
            out.append(same[at : at + n])
            at += n
        return out


@torch.inference_mode()
def calibrate(
    model: LlamaModel,
    prompts: Sequence[Sequence[int]],
    eos: set[int],
    max_k: int,
    num_tokens: int = 32,
    width: int = 3,
    patience: int = 3,
    cost: RelativeStepCost | None = None,
) -> tuple[SkipChoice, list[Candidate]]:
    """The best skip set and k (1..max_k) by expected speedup on the greedy continuations of
    `prompts` (token ids), and every candidate scored, in search order."""
    n = len(model.layers)
    if not prompts:
        raise ValueError("the self-speculation calibration needs at least one prompt")
    if n < 2:
        raise ValueError("self-speculation needs a target of at least 2 layers (one kept)")
    cost = cost or RelativeStepCost.of(model)
    scorer = AgreementScorer(model, prompts, eos, num_tokens)

    def score(skip: Sequence[int], search: str) -> Candidate:
        agree = scorer.agreement(skip)
        rate = sum(map(sum, agree)) / max(1, sum(map(len, agree)))
        speed, k = max((cost.speedup(mean_accepted(agree, k), k, n - len(skip)), -k)
                       for k in range(1, max_k + 1))  # fmt: skip
        return Candidate(tuple(sorted(skip)), search, rate, -k, speed)

    # keeping n - 1 layers is the single skip of the last one, scored with the singles
    scored = [score(range(keep, n), "early exit") for keep in range(1, n - 1)]
    singles = [score([i], "interleaved") for i in range(n)]
    scored += singles
    order = [c.skip[0] for c in sorted(singles, key=lambda c: (-c.speedup, c.skip))]
    grown, record, stale = (order[0],), max(c.speedup for c in singles), 0
    while len(grown) < n - 1 and stale < patience:
        tries = [score((*grown, i), "interleaved")
                 for i in [i for i in order if i not in grown][:width]]  # fmt: skip
        scored += tries
        pick = max(tries, key=lambda c: c.speedup)  # the first of equals: deterministic
        grown, stale = pick.skip, (0 if pick.speedup > record else stale + 1)
        record = max(record, pick.speedup)
    best = max(scored, key=lambda c: c.speedup)
    choice = SkipChoice(best.skip, n, best.k, best.agreement, best.speedup, best.search)
    return choice, scored
