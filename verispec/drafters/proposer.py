"""Helpers drafters share: drawing one warped draft token per row, and stacking q rows."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from verispec.engine.request import TokenHistory, all_greedy, noise_key, sampling_tensors
from verispec.sample import argmax_rows, sample, warp


def draw_drafts(
    logits: torch.Tensor,
    requests: Sequence[TokenHistory],
    drafts: Sequence[Sequence[int]],
    generator: torch.Generator,
) -> tuple[torch.Tensor | None, list[int]]:
    """One draft token per row of logits [n, target vocab], warped as each request warps (its
    drafts so far in its history): q [n, vocab] and the tokens; q is None when every row is
    greedy (one-hot at the argmax, which the verifier then implies). A seeded request's draft
    is argmax(q / E) with the noise of the output position it guesses, the noise its verifier
    races the target's p with (sample/rejection.py), so the two agree often; others draw from
    `generator`."""
    if all_greedy(requests):
        return None, argmax_rows(logits).tolist()
    t = sampling_tensors(list(zip(requests, drafts, strict=True)), logits.shape[1], logits.device)
    q = warp(logits, t)  # [n, vocab]
    keys = [noise_key(r, len(d)) for r, d in zip(requests, drafts, strict=True)]
    tokens = sample(q, keys, t.greedy, generator)
    return q, tokens.tolist()


def stack_draft_probs(
    drafts: Sequence[Sequence[int]],
    probs: Sequence[Sequence[torch.Tensor | None]],
    vocab_size: int,
    device: torch.device,
) -> torch.Tensor | None:
    """Drafts.probs: q rows [total drafts, vocab] in request order, a one-hot row where a draft
    was greedy (None), or None when every draft was greedy."""
    flat = [
        (d, p) for ds, ps in zip(drafts, probs, strict=True) for d, p in zip(ds, ps, strict=True)
    ]
    if all(p is None for _, p in flat):
        return None
    one_hot = torch.zeros(vocab_size, device=device)
    return torch.stack([
        p if p is not None else one_hot.index_fill(0, torch.tensor(d, device=device), 1.0)
        for d, p in flat
    ])  # fmt: skip
