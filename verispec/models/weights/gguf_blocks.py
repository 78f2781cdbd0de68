"""GGUF blocks as affine codes: each quantized GGML type's block bytes decoded straight into
integer codes q and per-group scales d, m with d * q + m equal, bit for bit, to what gguf's
dequantization (transformers' GGUF loader) computes, so the native kernel can use the file's
integers as stored and the float32 model never exists.

Why every form is exact: a block's d (and m) are float16 values, or for the K-quants the
float32 product of a float16 and a small integer (d * sc: at most 11 + 7 significant bits), and
q has at most 6 bits, so d * q is exact in float32 and d * q + m rounds once, as gguf's
`d * q + m` (or `d * q - dmin * m`) does.

Worked example (Q4_0, one block of 32): d = 0.5 (float16) and nibbles 0, 15, 8, ... give gguf's
values 0.5 * (q - 8) = -4.0, 3.5, 0.0, ...; here codes 0, 15, 8 with d = 0.5 and m = -4.0
(m = -8 d, a float16 value too), so the 4-bit kernel reads them two a byte.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from gguf import GGMLQuantizationType as GGML

from verispec.models.kernels.affine import AffineCodes, Q6Scales, SuperScales, dequantize_codes
from verispec.models.kernels.build import NativeKernel, native_kernel

QK = 32
"""Values per block of the legacy types (Q4_0 .. Q8_0) and per sub-block of Q4_K and Q5_K."""
QK_K = 256
"""Values per super-block of the K-quants."""

CODED_TYPES = (GGML.Q4_0, GGML.Q4_1, GGML.Q5_0, GGML.Q5_1, GGML.Q8_0, GGML.Q4_K, GGML.Q5_K,
               GGML.Q6_K)  # fmt: skip
"""The quantized types the native kernel computes as stored."""


def _f16(raw: np.ndarray) -> np.ndarray:
    """float16 bytes [..., 2] -> float32 values [..., 1]."""
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[B, 16] bytes -> [B, 32] codes: the low 4 bits of each byte, then the high 4 bits (the
    order ggml stores a 32-value block in)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """[B, 4] bytes of a little-endian 32-bit word -> [B, 32] bit i of the word, i = 0..31."""
    word = np.ascontiguousarray(qh).view(np.uint32)  # [B, 1]
    return ((word >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _legacy(blocks: np.ndarray, kind: GGML) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes [B, 32] int, d [B, 1], m [B, 1] of one legacy block per row of blocks."""
    d = _f16(blocks[:, :2])
    if kind == GGML.Q8_0:
        return blocks[:, 2:].view(np.int8).astype(np.int16), d, np.zeros_like(d)
    if kind == GGML.Q4_0:  # d (q - 8) = d q + (-8 d), -8 d a float16 value too
        return _nibbles(blocks[:, 2:]), d, -8 * d
    if kind == GGML.Q4_1:
        return _nibbles(blocks[:, 4:]), d, _f16(blocks[:, 2:4])
    if kind == GGML.Q5_0:  # d (q - 16), q = 4 low bits | the fifth bit << 4
        q = _nibbles(blocks[:, 6:]) | (_fifth_bits(blocks[:, 2:6]) << 4)
        return q.astype(np.int16) - 16, d, np.zeros_like(d)
    assert kind == GGML.Q5_1
    q = _nibbles(blocks[:, 8:]) | (_fifth_bits(blocks[:, 4:8]) << 4)
    return q, d, _f16(blocks[:, 2:4])


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 bytes of 6-bit scales and mins -> sc [B, 8], mn [B, 8] (ggml's
    get_scale_min_k4: sub-blocks 0-3 in the low 6 bits of bytes 0-3 / 4-7, sub-blocks 4-7 from
    bytes 8-11's nibbles and the top 2 bits of bytes 0-7)."""
    s = scales.reshape(-1, 3, 4)
    lo, hi, mix = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([lo & 0x3F, (mix & 0x0F) | ((lo >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([hi & 0x3F, (mix >> 4) | ((hi >> 2) & 0x30)], axis=-1)
    return sc, mn


def _k_quant(blocks: np.ndarray, kind: GGML) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes [B, 256], d [B, 8 or 16] and m [B, 8 or 16] of one super-block per row (groups of
    32 values for Q4_K and Q5_K, 16 for Q6_K)."""
    n = blocks.shape[0]
    if kind == GGML.Q6_K:  # d sc_j (q - 32), 16 sub-blocks of 16
        ql, qh = blocks[:, :128], blocks[:, 128:192]
        sc = blocks[:, 192:208].view(np.int8).astype(np.float32)
        d = _f16(blocks[:, 208:210]) * sc  # [B, 16]
        halves = ql.reshape(n, 2, 64)
        low = np.stack([halves & 0x0F, halves >> 4], axis=2).reshape(n, 2, 4, 32)
        # [B, half, 2 nib + part, 32] pairs with qh's 2-bit fields at shifts 0, 2, 4, 6
        high = (qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8)
                .reshape(1, 1, 4, 1)) & 0x03  # [B, half, 4, 32]  # fmt: skip
        q = (low | (high << 4)).astype(np.int16) - 32
        return q.reshape(n, QK_K), d, np.zeros_like(d)
    d16, dmin = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
    sc, mn = _k_scales(blocks[:, 4:16])
    d = d16 * sc.astype(np.float32)  # [B, 8]
    m = -(dmin * mn.astype(np.float32))
    if kind == GGML.Q4_K:
        qs = blocks[:, 16:].reshape(n, 4, 32)  # 4 pairs of sub-blocks: low nibbles, then high
        q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(n, QK_K)
        return q, d, m
    assert kind == GGML.Q5_K
    qh, qs = blocks[:, 16:48], blocks[:, 48:].reshape(n, 4, 32)
    low = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32)
    fifth = (qh.reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    return (low | (fifth << 4)).reshape(n, QK_K), d, m


def block_codes(data: np.ndarray, kind: GGML, rows: int, columns: int) -> AffineCodes:
    """The affine codes of one GGUF tensor's blocks: data [rows, bytes a row] uint8 as the file
    holds them (a row of `columns` values is columns / block_size blocks), kind one of
    CODED_TYPES. Codes [rows, columns] int8; d, m [rows, columns / group] float32, group 16 for
    Q6_K, else 32. ValueError for a kind this module does not decode.
    Decoded by kernels/native/blocks.c where the native kernel loaded (the same bits: tested),
    else by this module's numpy forms."""
    if kind not in CODED_TYPES:
        raise ValueError(f"GGML type {kind.name} has no affine codes here")
    per_block = QK_K if kind in (GGML.Q4_K, GGML.Q5_K, GGML.Q6_K) else QK
    group = 16 if kind == GGML.Q6_K else QK
    data = data.reshape(rows, -1)
    codes = np.empty((rows, columns), dtype=np.int8)
    d = np.empty((rows, columns // group), dtype=np.float32)
    m = np.empty_like(d)
    kernel = native_kernel()
    if isinstance(kernel, NativeKernel):
        data = np.ascontiguousarray(data)
        done = kernel.lib.verispec_block_codes(int(kind), data.ctypes.data,
                                               rows * (columns // per_block), codes.ctypes.data,
                                               d.ctypes.data, m.ctypes.data,
                                               torch.get_num_threads())  # fmt: skip
        assert done == 0, kind  # every CODED_TYPES member is one of blocks.c's types
        factors = None  # d's (and m's) factors as stored: Q4_SUPER_DM and Q6_SUPER_D
        if kind == GGML.Q4_K:
            factors = _q4_k_factors(kernel, data, rows, columns)
        elif kind == GGML.Q6_K:
            factors = q6_k_factors(data, rows, columns, kernel)
        return AffineCodes(torch.from_numpy(codes), torch.from_numpy(d), torch.from_numpy(m), group,
                           factors)  # fmt: skip
    return _numpy_block_codes(data, kind, rows, columns, codes, d, m, per_block, group)


def _q4_k_factors(kernel: NativeKernel, data: np.ndarray, rows: int, columns: int) -> SuperScales:
    """The SuperScales of a Q4_K tensor's blocks (data [rows, bytes a row], contiguous)."""
    supers = columns // QK_K
    d16 = torch.empty(rows, supers, dtype=torch.float16)
    negmin = torch.empty_like(d16)
    sub_d = torch.empty(rows, supers * 8, dtype=torch.uint8)
    sub_m = torch.empty_like(sub_d)
    kernel.lib.verispec_q4_k_super(data.ctypes.data, rows * supers, d16.data_ptr(),
                                   negmin.data_ptr(), sub_d.data_ptr(), sub_m.data_ptr(),
                                   torch.get_num_threads())  # fmt: skip
    return SuperScales(d16, negmin, sub_d, sub_m)


def q6_k_factors(
    data: np.ndarray, rows: int, columns: int, kernel: NativeKernel | None = None
) -> Q6Scales:
    """The Q6Scales of a Q6_K tensor's blocks (data [rows, bytes a row], contiguous): each
    super-block's float16 d (bytes 208, 209) and int8 sc (bytes 192 .. 207) as stored. By
    blocks.c with a kernel, else by numpy (the same bytes: tested)."""
    supers = columns // QK_K
    if kernel is None:
        blocks = data.reshape(rows, supers, -1)
        d16 = np.ascontiguousarray(blocks[:, :, 208:210]).view(np.float16).reshape(rows, supers)
        sc = np.ascontiguousarray(blocks[:, :, 192:208]).view(np.int8).reshape(rows, supers * 16)
        return Q6Scales(torch.from_numpy(d16), torch.from_numpy(sc))
    d16_out = torch.empty(rows, supers, dtype=torch.float16)
    sc_out = torch.empty(rows, supers * 16, dtype=torch.int8)
    kernel.lib.verispec_q6_k_super(data.ctypes.data, rows * supers, d16_out.data_ptr(),
                                   sc_out.data_ptr(), torch.get_num_threads())  # fmt: skip
    return Q6Scales(d16_out, sc_out)


def _numpy_block_codes(data: np.ndarray, kind: GGML, rows: int, columns: int, codes: np.ndarray,
                       d: np.ndarray, m: np.ndarray, per_block: int,
                       group: int) -> AffineCodes:  # fmt: skip
    """block_codes by numpy, into codes, d and m, a slice of rows at a time."""
    step = max(1, (1 << 20) // columns)  # rows at a time: the decoding's temporaries stay small
    for start in range(0, rows, step):
        end = min(rows, start + step)
        count = (end - start) * (columns // per_block)
        blocks = np.ascontiguousarray(data[start:end]).reshape(count, -1)
        q, dq, mq = (_k_quant if per_block == QK_K else _legacy)(blocks, kind)
        codes[start:end] = q.reshape(end - start, columns)
        d[start:end] = dq.reshape(end - start, -1)
        m[start:end] = mq.reshape(end - start, -1)
    return AffineCodes(torch.from_numpy(codes), torch.from_numpy(d), torch.from_numpy(m), group)


def regrouped(codes: AffineCodes, group: int) -> AffineCodes:
    """The same codes with d and m given per `group` columns (a divisor of codes.group); their
    SuperScales, which are per 32 columns, are left out (Q6_K's Q6Scales are per 16, the
    finest group, so never regrouped)."""
    if group == codes.group:
        return codes
    assert codes.group % group == 0, (codes.group, group)
    repeat = codes.group // group
    return AffineCodes(codes.codes, codes.d.repeat_interleave(repeat, dim=1),
                       codes.m.repeat_interleave(repeat, dim=1), group)  # fmt: skip


def stacked(parts: Sequence[AffineCodes | torch.Tensor]) -> AffineCodes | torch.Tensor:
    """Weights stacked row-wise (q, k and v into one qkv; gate and up): as codes when every
    part is codes (with the finest group among them), else as float32 values."""
    if all(isinstance(p, AffineCodes) for p in parts):
        codes = [p for p in parts if isinstance(p, AffineCodes)]
        group = min(p.group for p in codes)
        same = [regrouped(p, group) for p in codes]
        factors = [p.super_scales for p in same if p.super_scales is not None]
        kinds = {type(f) for f in factors}  # SuperScales (Q4_K) or Q6Scales (Q6_K)
        whole = kinds.pop().cat(factors) if len(factors) == len(same) and len(kinds) == 1 else None
        return AffineCodes(torch.cat([p.codes for p in same]), torch.cat([p.d for p in same]),
                           torch.cat([p.m for p in same]), group, whole)  # fmt: skip
    return torch.cat([dequantize_codes(p) if isinstance(p, AffineCodes) else p for p in parts])


def permuted_rows(codes: AffineCodes, order: torch.Tensor) -> AffineCodes:
    """Rows of codes in `order` (a permutation), e.g. llama.cpp's rotary q/k order undone."""
    factors = None if codes.super_scales is None else codes.super_scales.rows(order)
    return AffineCodes(codes.codes[order], codes.d[order], codes.m[order], codes.group, factors)
