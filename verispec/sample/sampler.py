"""Sync-free sampling from warped distributions (gpt-fast's exponential-race trick)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from verispec.sample.noise import NoiseKey, exponentials


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
    keys: Sequence[NoiseKey | None],
    generator: torch.Generator | None,
    support_only: bool,
) -> torch.Tensor:
    """Exponential(1) noise shaped like `probs` [n, vocab]: row i is the counter-based noise of
    keys[i] (sample/noise.py) where it has a key, else drawn from `generator` in row order.

    support_only (the CPU's choice, where finding the support needs no sync): a row gets noise
    for its support (p > 0) only and holds 1 elsewhere. A token with p = 0 scores 0 whatever its
    noise, so the race and its winner are the same in law (for a keyed row, the very same
    winner), and a top-p row keeps tens to hundreds of tokens of a vocabulary of tens of
    thousands.
    """
    keyed = [i for i, key in enumerate(keys) if key is not None]
    words = torch.tensor(
        [key.words() for key in keys if key is not None], dtype=torch.int64, device=probs.device
    ).reshape(-1, 2)  # [m, 2]: (a, b) per keyed row
    if support_only:
        noise = torch.ones_like(probs, dtype=torch.float32)  # [n, vocab]
        for i, key in enumerate(keys):
            if key is None:
                support = (probs[i] > 0).nonzero().squeeze(1)  # [s] token ids
                draw = torch.empty(len(support), dtype=torch.float32)
                noise[i, support] = draw.exponential_(generator=generator)
        if keyed:
            rows = torch.tensor(keyed, dtype=torch.int64, device=probs.device)  # [m]
            row, token = (probs[rows] > 0).nonzero().unbind(1)  # [S] each: a keyed row's support
            noise[rows[row], token] = exponentials(words[row, 0], words[row, 1], token)
        return noise
    noise = torch.empty_like(probs, dtype=torch.float32)  # [n, vocab]
    if not keyed:
        return noise.exponential_(generator=generator)
    for i, key in enumerate(keys):
        if key is None:
            noise[i].exponential_(generator=generator)
    ids = torch.arange(probs.shape[1], device=probs.device)  # [vocab]
    noise[keyed] = exponentials(words[:, :1], words[:, 1:], ids)  # [m, vocab]
    return noise


def sample(
    probs: torch.Tensor,
    keys: Sequence[NoiseKey | None],
    greedy: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Draw one token per row of `probs` [n, vocab] without a host sync; returns [n] int64.

    Sync-free sampling as gpt-fast does: argmax(probs / E) with E ~ Exponential(1) i.i.d.: row
    i's noise is the counter-based noise of keys[i] (a seeded request's output position,
    sample/noise.py), or, where keys[i] is None, drawn from `generator` (None: torch's default);
    rows where `greedy` [n] is True take argmax(probs) instead.

    Why argmax(p / E) samples from p (the exponential race): E_i / p_i ~ Exponential(rate p_i),
    and the first of independent exponential clocks to ring is clock i with probability
    p_i / sum_j p_j = p_i. argmax(p_i / E_i) = argmin(E_i / p_i) is exactly that clock.
    Example: p = [0.75, 0.25, 0], E = [0.9, 0.1, 0.5] gives p / E = [0.83, 2.5, 0], so token 1;
    token 0 wins with probability P(E_0 / 0.75 < E_1 / 0.25) = 0.75 / (0.75 + 0.25) = 0.75,
    and token 2 (p = 0) scores 0 and never wins, since some token with p > 0 scores > 0.
    Noise is clamped away from 0 so that 0 / 0 never yields a NaN (argmax would pick it).
    """
    if len(keys) != probs.shape[0]:
        raise ValueError(
            f"keys must have one entry per row of probs ({probs.shape[0]}), got {len(keys)}"
        )
    noise = _exponential_noise(probs, keys, generator, probs.device.type == "cpu")  # [n, vocab]
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)
    tokens = argmax_rows(probs.float() / noise)  # [n]
    if greedy is not None:
        tokens = torch.where(greedy, argmax_rows(probs), tokens)
    return tokens
