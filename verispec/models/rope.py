"""Rotary position embedding: inverse frequencies (linear / llama3 scaling) and rotation."""

from __future__ import annotations

import math
from typing import Any

import torch


def inverse_frequencies(
    head_dim: int, theta: float, scaling: dict[str, Any] | None
) -> torch.Tensor:
    """Per-pair rotation speeds, [head_dim // 2] float32, as Hugging Face computes them.

    Example: head_dim=4, theta=10000, no scaling -> [1.0, 0.01], i.e. 10000 ** -(0/4), ** -(2/4).
    "linear" divides every frequency by factor; "llama3" divides only the low frequencies
    (wavelength above original_max_position_embeddings / low_freq_factor), blends the middle.
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)  # [head_dim // 2]
    if scaling is None:
        return inv_freq
    factor = float(scaling["factor"])
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_medium, blended, scaled)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables for the given positions, each [num_tokens, head_dim] in dtype."""
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, head_dim // 2]
    angles = torch.cat((freqs, freqs), dim=-1)  # [T, head_dim]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, head_dim] by position (the half-split convention of transformers)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
