"""Logits warping: raw logits -> the warped distribution p that sampling and verification use.

Target and drafter both go through `warp`, so p and q are warped identically (docs/design.md, 3).
Every step is a batched tensor op; python flags on `SamplingTensors` skip steps no row needs,
so the hot path never reads a value back from the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from verispec.sampling_params import SamplingParams

# float32 probabilities and their sums are off by a few ulps, so the inclusive boundaries of
# top-p ("mass >= top_p") and min-p ("p >= min_p * max p") get this slack: probs
# [0.5, 0.3, 0.15, 0.05] keep exactly two tokens with top_p=0.8 and four with min_p=0.1.
_BOUNDARY_TOL = 1e-6


@dataclass(slots=True)
class SamplingTensors:
    """Per-row sampling parameters of one batch of logits rows, built once per step.

    Greedy rows hold the disabled value of temperature, top-k, top-p and min-p (they take the
    argmax instead), so each `need_*` flag is True exactly when some row changes that step.
    """

    temperature: torch.Tensor  # [n] float32; greedy rows hold 1.0 (unused)
    greedy: torch.Tensor  # [n] bool
    top_k: torch.Tensor  # [n] int64, vocab_size where disabled
    top_p: torch.Tensor  # [n] float32, 1.0 where disabled
    min_p: torch.Tensor  # [n] float32, 0.0 where disabled
    repetition_penalty: torch.Tensor  # [n] float32, 1.0 where disabled
    presence_penalty: torch.Tensor  # [n] float32, 0.0 where disabled
    frequency_penalty: torch.Tensor  # [n] float32, 0.0 where disabled
    prompt_mask: torch.Tensor | None  # [n, vocab] bool: token occurs in the prompt
    output_counts: torch.Tensor | None  # [n, vocab] float32: occurrences in the output so far
    all_greedy: bool  # every row is greedy: skip temperature and truncation entirely
    any_greedy: bool  # some row is greedy: overwrite those rows with a one-hot
    need_penalties: bool  # some row has a penalty: prompt_mask/output_counts are set
    need_top_k: bool  # some row keeps fewer than vocab_size tokens by top-k
    need_top_p: bool  # some row has top_p < 1
    need_min_p: bool  # some row has min_p > 0

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        prompt_token_ids: Sequence[Sequence[int]],
        output_token_ids: Sequence[Sequence[int]],
        vocab_size: int,
        device: torch.device | str = "cpu",
    ) -> SamplingTensors:
        """Gather one row per entry of `params` (the verifier passes one row per draft position,
        whose output ids include the earlier drafts), as tensors on `device`."""
        if not len(params) == len(prompt_token_ids) == len(output_token_ids):
            raise ValueError(
                f"params, prompt_token_ids and output_token_ids must have one entry per row, got "
                f"{len(params)}, {len(prompt_token_ids)} and {len(output_token_ids)}"
            )
        temperature = _unless_greedy(params, "temperature", 1.0)
        top_k = [k if 0 < k < vocab_size else vocab_size
                 for k in _unless_greedy(params, "top_k", vocab_size)]  # fmt: skip
        top_p = _unless_greedy(params, "top_p", 1.0)
        min_p = _unless_greedy(params, "min_p", 0.0)
        greedy = [p.greedy for p in params]
        need_penalties = any(p.needs_penalties for p in params)
        prompt_mask = output_counts = None
        if need_penalties:
            prompt_mask, output_counts = _histories(
                params, prompt_token_ids, output_token_ids, vocab_size, device
            )

        def f32(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        return cls(
            temperature=f32(temperature),
            greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            top_k=torch.tensor(top_k, dtype=torch.int64, device=device),
            top_p=f32(top_p),
            min_p=f32(min_p),
            repetition_penalty=f32([p.repetition_penalty for p in params]),
            presence_penalty=f32([p.presence_penalty for p in params]),
            frequency_penalty=f32([p.frequency_penalty for p in params]),
            prompt_mask=prompt_mask,
            output_counts=output_counts,
            all_greedy=all(greedy),
            any_greedy=any(greedy),
            need_penalties=need_penalties,
            need_top_k=any(k < vocab_size for k in top_k),
            need_top_p=any(p < 1.0 for p in top_p),
            need_min_p=any(p > 0.0 for p in min_p),
        )


def _unless_greedy(params: Sequence[SamplingParams], field: str, off: float) -> list[float]:
    """Each row's value of `field`, or `off` (the disabled value) for greedy rows, which never
    reach temperature or truncation."""
    return [off if p.greedy else getattr(p, field) for p in params]


def _histories(
    params: Sequence[SamplingParams],
    prompt_token_ids: Sequence[Sequence[int]],
    output_token_ids: Sequence[Sequence[int]],
    vocab_size: int,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt-occurrence mask and output counts [n, vocab], filled only for rows with penalties
    (other rows stay empty, which makes the penalty step a no-op for them)."""
    n = len(params)
    rows = [i for i, p in enumerate(params) if p.needs_penalties]

    def flat(ids: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        row_of = [i for i in rows for _ in ids[i]]
        tokens = [t for i in rows for t in ids[i]]
        as_long = {"dtype": torch.int64, "device": device}
        return torch.tensor(row_of, **as_long), torch.tensor(tokens, **as_long)

    prompt_mask = torch.zeros(n, vocab_size, dtype=torch.bool, device=device)  # [n, vocab]
    prompt_mask[flat(prompt_token_ids)] = True
    output_counts = torch.zeros(n, vocab_size, dtype=torch.float32, device=device)  # [n, vocab]
    out_rows, out_tokens = flat(output_token_ids)
    one = torch.ones((), dtype=torch.float32, device=device)
    output_counts.index_put_((out_rows, out_tokens), one, accumulate=True)
    return prompt_mask, output_counts


def apply_penalties(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """Repetition, frequency and presence penalties with vLLM's semantics; returns a new tensor.

    Repetition counts tokens seen in the prompt OR the output (positive logits are divided by
    the penalty, others multiplied, so the token always becomes less likely); frequency and
    presence count the output only: logit -= frequency * count + presence * (count > 0).
    """
    if t.prompt_mask is None or t.output_counts is None:  # None exactly when no row needs them
        return logits
    counts = t.output_counts  # [n, vocab]
    seen = t.prompt_mask | (counts > 0)  # [n, vocab]
    rep = t.repetition_penalty.unsqueeze(1)  # [n, 1]
    penalised = torch.where(logits > 0, logits / rep, logits * rep)  # [n, vocab]
    logits = torch.where(seen, penalised, logits)
    logits = logits - t.frequency_penalty.unsqueeze(1) * counts
    return logits - t.presence_penalty.unsqueeze(1) * (counts > 0).to(logits.dtype)


def _truncate_sorted(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """Top-k then top-p on one stable descending sort (ties keep the lowest token id first).

    Top-k keeps exactly k tokens. Top-p keeps the smallest prefix of the sorted top-k survivors
    whose renormalised mass reaches top_p: a token stays while the mass strictly above it is
    below top_p. Example: p = [0.5, 0.3, 0.15, 0.05], top_p = 0.8 keeps 2, top_p = 0.81 keeps 3.
    """
    vocab = logits.shape[1]
    sorted_logits, order = torch.sort(logits, dim=1, descending=True, stable=True)  # [n, vocab]
    rank = torch.arange(vocab, device=logits.device)  # [vocab]
    remove = rank.unsqueeze(0) >= t.top_k.unsqueeze(1)  # [n, vocab] in sorted order
    if t.need_top_p:
        probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(dim=1)  # [n, vocab]
        mass_above = probs.cumsum(dim=1) - probs  # [n, vocab] mass of the tokens ranked higher
        over = mass_above >= (t.top_p - _BOUNDARY_TOL).unsqueeze(1)
        over[:, 0] = False  # the most probable token always stays
        remove |= over & (t.top_p < 1.0).unsqueeze(1)  # rows with top_p = 1 keep everything
    remove = remove.scatter(1, order, remove)  # back to token order
    return logits.masked_fill(remove, float("-inf"))


def warp(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """The ONE function that turns raw logits [n, vocab] into the warped distribution p [n, vocab]
    (float32, rows sum to 1).

    Order as in Hugging Face generate: penalties -> temperature -> top-k -> top-p -> min-p ->
    softmax. Greedy rows get a one-hot at the argmax of the penalised logits (ties: lowest id).
    """
    x = apply_penalties(logits.float(), t)  # [n, vocab]
    greedy_p = None
    if t.any_greedy:
        top = x.argmax(dim=1, keepdim=True)  # [n, 1]
        greedy_p = torch.zeros_like(x).scatter_(1, top, 1.0)  # [n, vocab] one-hot
        if t.all_greedy:
            return greedy_p
    x = x / t.temperature.unsqueeze(1)
    if t.need_top_k or t.need_top_p:
        x = _truncate_sorted(x, t)
    if t.need_min_p:
        probs = x.softmax(dim=1)  # [n, vocab]
        floor = (t.min_p - _BOUNDARY_TOL).unsqueeze(1) * probs.amax(dim=1, keepdim=True)  # [n, 1]
        x = x.masked_fill(probs < floor, float("-inf"))
    p = x.softmax(dim=1)  # [n, vocab]
    if greedy_p is not None:
        p = torch.where(t.greedy.unsqueeze(1), greedy_p, p)
    return p
