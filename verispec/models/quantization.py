"""Weight-only quantization: the optional rounding of linear-layer weights at load time.

Speculative decoding stays lossless with respect to the model that is actually run: with a
quantized target the output is exactly (greedy) or in distribution (sampling) that quantized
target's, not the checkpoint's. A quantized draft changes only how often drafts are accepted.
"""

from __future__ import annotations

import torch

QUANTIZATIONS = ("fp16", "int8")


def check_quantization(name: str | None, what: str = "quantization") -> None:
    """ValueError unless name is None or one of QUANTIZATIONS."""
    if name is not None and name not in QUANTIZATIONS:
        raise ValueError(
            f"{what} must be one of {', '.join(QUANTIZATIONS)} or None (off); got {name!r}"
        )


def round_to_fp16(weight: torch.Tensor) -> torch.Tensor:
    """Each value rounded to the nearest float16 (kept in weight's dtype; the fp16 kernel then
    stores it in float16 without further loss). Example: 0.1 -> 0.0999755859375."""
    return weight.to(torch.float16).to(weight.dtype)


def int8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: weight [out, in] ~= q [out, in] int8 * scale [out, 1].

    scale = max |row| / 127 (1 for an all-zero row), q = round(w / scale) in [-127, 127].
    Example: row [0.5, -1.0, 0.25] -> scale 1/127, q [64, -127, 32] (0.5 * 127 = 63.5 rounds
    to the even 64), dequantized [0.504, -1.0, 0.252].
    """
    w = weight.float()
    scale = w.abs().amax(dim=1) / 127.0  # [out]
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)  # [out, in]
    return q.contiguous(), scale.to(weight.dtype)
