"""Quantization: the optional rounding of linear-layer weights at load time, and of their
inputs at every product ("a8", "w8a8").

Speculative decoding stays lossless with respect to the model that is actually run: with a
quantized target the output is exactly (greedy) or in distribution (sampling) that quantized
target's, not the checkpoint's. A quantized draft changes only how often drafts are accepted.
"""

from __future__ import annotations

import torch

from verispec.models.kernels import build
from verispec.models.kernels.affine import AffineCodes, dequantize_codes
from verispec.types.numerics import ACTIVATION_QUANTIZATIONS, AUTO_DRAFT

Q8_0_COLUMNS = 32  # values per block sharing one scale, as in GGUF's Q8_0


def draft_quantization(
    requested: str | None, backend: str, device: torch.device, dtype: torch.dtype, compile: bool,
    rounding: str = "w8a8",
) -> str | None:  # fmt: skip
    """The quantization a draft model loads with: `requested`, or for AUTO_DRAFT `rounding`
    (one of ACTIVATION_QUANTIZATIONS: "w8a8" unless the draft's catalog entry names another)
    on a float32 CPU model with the native backend available ("auto" or "native"), not
    compiled, where the kernel's 8-bit products run in integers (any dot product but the
    portable scalar loop), else None. Example: ("auto", "auto", cpu, float32, False) -> "w8a8"
    on a Zen 3 (AVX2) or a Zen 4, None on a CPU that runs the portable C path."""
    if requested != AUTO_DRAFT:
        return requested
    if backend not in ("auto", "native") or device.type != "cpu" or dtype != torch.float32:
        return None
    if compile:
        return None
    kernel = build.native_kernel()
    return rounding if isinstance(kernel, build.NativeKernel) and kernel.dot > 0 else None


def numerics_name(quantization: str | None) -> str:
    """What a resolved quantization means, for settings and start lines. Examples: "a8" ->
    "a8 (8-bit inputs, as llama.cpp)", None -> "exact float inputs"."""
    if quantization is None:
        return "exact float inputs"
    if quantization in ACTIVATION_QUANTIZATIONS:
        return f"{quantization} (8-bit inputs, as llama.cpp)"
    return f"{quantization} (weights rounded at load)"


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


def round_to_q4_1(weight: torch.Tensor | AffineCodes) -> AffineCodes:
    """Each 32-value block of a row as GGUF's Q4_1 stores it: m = its minimum and d = (max - m)
    / 15, both rounded to float16, q = round((w - m) / d) clamped to 0..15 (0 where d is 0);
    w ~= d q + m. The native kernel streams these codes two a byte with float16 d and m (linear.c
    Q4_A8 under "w4a8": 0.625 bytes a value). weight may be codes (a GGUF file's), dequantized
    a few rows at a time. ValueError unless K is a multiple of 32.
    Example: a block [0.0, 1.5, 3.0, 0.75, then 28 zeros] -> m 0, d 0.2 (float16
    0.199951171875), q [0, 8, 15, 4, 0, ...] (1.5 / d = 7.50 rounds to 8)."""
    n, k = weight.codes.shape if isinstance(weight, AffineCodes) else weight.shape
    if k % Q8_0_COLUMNS:
        raise ValueError(f"w4a8 rounds blocks of {Q8_0_COLUMNS} columns; this weight has {k}")
    q = torch.empty(n, k, dtype=torch.int8)
    d = torch.empty(n, k // Q8_0_COLUMNS)
    m = torch.empty_like(d)
    step = max(1, (1 << 22) // k)  # rows at a time: transients stay a few megabytes
    for start in range(0, n, step):
        rows = slice(start, start + step)
        part = (dequantize_codes(weight.rows(rows)) if isinstance(weight, AffineCodes)
                else weight[rows].float())  # fmt: skip
        w = part.view(-1, k // Q8_0_COLUMNS, Q8_0_COLUMNS)
        low, high = torch.aminmax(w, dim=-1, keepdim=True)  # [rows, K/32, 1]
        mr = low.half().float()
        dr = ((high - mr) / 15).half().float()
        safe = torch.where(dr > 0, dr, torch.ones_like(dr))
        qr = torch.where(dr > 0, torch.round((w - mr) / safe).clamp_(0, 15), torch.zeros_like(w))
        blocks = k // Q8_0_COLUMNS
        q[rows], d[rows], m[rows] = qr.view(-1, k), dr.view(-1, blocks), mr.view(-1, blocks)
    return AffineCodes(q, d, m)


def round_to_q8_0(weight: torch.Tensor) -> torch.Tensor:
    """Each 32-value block of a row rounded as GGUF's Q8_0 stores it: d * q with d = max |w| /
    127 rounded to float16 and q = round(w / d) in [-127, 127] (kept in weight's dtype).

    The native kernel then streams the rounded weight as 8-bit codes with float16 d, 1.0625
    bytes a value (affine.affine_codes recognises the form, packing.pack_codes stores it as
    Q8_F16_D); other kernels compute with the rounded float values. Example: a block [0.5, -1.0,
    0.25, 0, ...] -> d = fp16(1 / 127) = 0.0078735..., q [64, -127, 32, 0, ...] (0.5 / d =
    63.5047 rounds to 64), values [0.50390625, -0.99993896484375, 0.251953125, 0, ...].
    """
    n, k = weight.shape
    padded = -(-k // Q8_0_COLUMNS) * Q8_0_COLUMNS
    w = torch.nn.functional.pad(weight.float(), (0, padded - k)).view(n, -1, Q8_0_COLUMNS)
    d = (w.abs().amax(-1, keepdim=True) / 127).half().float()  # [N, K/32, 1]
    safe = torch.where(d > 0, d, torch.ones_like(d))
    q = torch.where(d > 0, torch.round(w / safe).clamp_(-127, 127), torch.zeros_like(w))
    return (d * q).view(n, padded)[:, :k].to(weight.dtype).contiguous()
