"""Sync-free sampling from warped distributions (gpt-fast's exponential-race trick)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """[n, V] -> [n] int64: each row's index of its first largest value (a NaN counts as the
    largest), as x.argmax(dim=1). A float32 CPU tensor goes through numpy, whose argmax is
    6-15x faster than torch's (measured: 49,152-wide rows, 1 row 6 vs 99 us, 5 rows 23 vs
    295 us): a greedy step takes one argmax per new token. E.g. [[1, 3, 3], [nan, 9, 0]] ->
    [1, 0]."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2:
        return torch.from_numpy(x.detach().numpy().argmax(axis=1).astype("int64", copy=False))
    return x.argmax(dim=1)


def _exponential_noise(
    probs: torch.Tensor,
    generators: Sequence[torch.Generator | None],
    default_generator: torch.Generator | None,
) -> torch.Tensor:
    """Exponential(1) noise shaped like `probs`, row i drawn from generators[i] (None: default).

    Each seeded row takes its own draw, so a request's tokens do not depend on its batch mates.
    On the CPU a row draws noise for its support (p > 0) only and holds 1 elsewhere: a token
    with p = 0 scores 0 whatever its noise, so the race and its winner are the same in law,
    and torch's exponential_ costs about 25 ns a value here (1.2 ms for a 49,152-token row,
    a tenth of a SmolLM2 decode step; a top-p row keeps tens to hundreds of tokens).
    """
    if probs.device.type == "cpu":
        noise = torch.ones_like(probs, dtype=torch.float32)  # [n, vocab]
        for row, p, g in zip(noise, probs, generators, strict=True):
            support = (p > 0).nonzero().squeeze(1)  # [m] token ids
            draw = torch.empty(len(support), dtype=torch.float32)
            row[support] = draw.exponential_(generator=default_generator if g is None else g)
        return noise
    noise = torch.empty_like(probs, dtype=torch.float32)  # [n, vocab]
    if all(g is None for g in generators):
        return noise.exponential_(generator=default_generator)
    for row, g in zip(noise, generators, strict=True):
        row.exponential_(generator=default_generator if g is None else g)
    return noise


def sample(
    probs: torch.Tensor,
    generators: Sequence[torch.Generator | None],
    greedy: torch.Tensor | None = None,
    default_generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Draw one token per row of `probs` [n, vocab] without a host sync; returns [n] int64.

    Sync-free sampling as gpt-fast does: argmax(probs / E) with E ~ Exponential(1) i.i.d., one
    noise row per row drawn from that row's generator (rows whose generator is None use
    `default_generator`); rows where `greedy` [n] is True take argmax(probs) instead.

    Why argmax(p / E) samples from p (the exponential race): E_i / p_i ~ Exponential(rate p_i),
    and the first of independent exponential clocks to ring is clock i with probability
    p_i / sum_j p_j = p_i. argmax(p_i / E_i) = argmin(E_i / p_i) is exactly that clock.
    Example: p = [0.75, 0.25, 0], E = [0.9, 0.1, 0.5] gives p / E = [0.83, 2.5, 0], so token 1;
    token 0 wins with probability P(E_0 / 0.75 < E_1 / 0.25) = 0.75 / (0.75 + 0.25) = 0.75,
    and token 2 (p = 0) scores 0 and never wins, since some token with p > 0 scores > 0.
    Noise is clamped away from 0 so that 0 / 0 never yields a NaN (argmax would pick it).
    """
    if len(generators) != probs.shape[0]:
        raise ValueError(
            f"generators must have one entry per row of probs ({probs.shape[0]}), "
            f"got {len(generators)}"
        )
    noise = _exponential_noise(probs, generators, default_generator)  # [n, vocab]
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)
    tokens = argmax_rows(probs.float() / noise)  # [n]
    if greedy is not None:
        tokens = torch.where(greedy, argmax_rows(probs), tokens)
    return tokens
