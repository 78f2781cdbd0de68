"""GGUF-style affine codes, w = d * q + m per row and block of columns (AffineCodes, with the
file's own factors of d and m: SuperScales for Q4_K, Q6Scales for Q6_K), found in float32
weights bit for bit (`affine_codes`) or turned back into them (`dequantize_codes`); the packers
(packing.py) lay them out for the native kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

CODE_COLUMNS = 32
"""Columns per (d, m) pair of affine codes: a GGUF quantization block."""


SUPER_COLUMNS = 256
"""Columns per super-block of GGUF's K-quants: one float16 d16 and dmin per row for each."""


@dataclass(frozen=True)
class SuperScales:
    """The factors of Q4_K codes' d and m as the file stores them: d = d16 * sub_d and m =
    negmin * sub_m, each product exact in float32 (an 11-bit significand times a 6-bit
    integer), so the kernel rebuilds AffineCodes.d and .m bit for bit from 0.078 bytes a weight
    instead of 0.25. d16, negmin [N, K/256] float16 (negmin = -dmin); sub_d, sub_m [N, K/32]
    uint8 (6-bit sc and mn)."""

    d16: torch.Tensor
    negmin: torch.Tensor
    sub_d: torch.Tensor
    sub_m: torch.Tensor

    def rows(self, index: slice | torch.Tensor) -> SuperScales:
        """The same rows of every factor (a slice or a permutation)."""
        return SuperScales(self.d16[index], self.negmin[index], self.sub_d[index],
                           self.sub_m[index])  # fmt: skip

    @staticmethod
    def cat(parts: Sequence[SuperScales]) -> SuperScales:
        """Parts stacked row-wise (gate and up into one weight)."""
        return SuperScales(*(torch.cat([getattr(p, f) for p in parts])
                             for f in ("d16", "negmin", "sub_d", "sub_m")))  # fmt: skip


@dataclass(frozen=True)
class Q6Scales:
    """The factors of Q6_K codes' d as the file stores them: d = d16 * sc, exact in float32 (an
    11-bit significand times an 8-bit integer), m = 0, so the kernel rebuilds AffineCodes.d bit
    for bit from 0.07 bytes a weight instead of 0.25 (Q6_SUPER_D). d16 [N, K/256] float16; sc
    [N, K/16] int8."""

    d16: torch.Tensor
    sc: torch.Tensor

    def rows(self, index: slice | torch.Tensor) -> Q6Scales:
        """The same rows of both factors (a slice or a permutation)."""
        return Q6Scales(self.d16[index], self.sc[index])

    @staticmethod
    def cat(parts: Sequence[Q6Scales]) -> Q6Scales:
        """Parts stacked row-wise."""
        return Q6Scales(torch.cat([p.d16 for p in parts]), torch.cat([p.sc for p in parts]))


@dataclass(frozen=True)
class AffineCodes:
    """W [N, K] as w = d * q + m per row and 32-column chunk (or 16-column half of one, see
    group), exactly: codes q [N, K'] int8, d and m [N, K'/group] float32 (K padded with zeros to
    K', a multiple of 32)."""

    codes: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor
    group: int = 32
    """Columns per (d, m): 32, or 16 (GGUF Q6_K's sub-blocks); d and m are [N, K'/group]."""
    super_scales: SuperScales | Q6Scales | None = None
    """d's and m's factors as a GGUF Q4_K or Q6_K file stores them, when the codes came from
    one."""

    def rows(self, index: slice | torch.Tensor) -> AffineCodes:
        """The codes of rows index (a slice, or [R] ids: e.g. an LM head cut to a reduced
        vocabulary before it is packed) only, their d, m and the file's factors with them."""
        factors = None if self.super_scales is None else self.super_scales.rows(index)
        return AffineCodes(self.codes[index], self.d[index], self.m[index], self.group, factors)

    @property
    def four_bit(self) -> bool:
        """Every code in 0..15 (GGUF Q4_1, Q4_K blocks): the kernel then stores two a byte."""
        if self.codes.numel() == 0:
            return True
        low, high = torch.aminmax(self.codes)  # one pass, no boolean copies
        return bool(low >= 0) and bool(high <= 15)


def dequantize_codes(codes: AffineCodes) -> torch.Tensor:
    """The float32 values [N, K] the codes stand for: d * q + m per group. d * q is exact in
    float32 (see gguf_blocks.py's docstring), so the one rounding is the addition's, as gguf's."""
    n, k = codes.codes.shape
    out = torch.empty(n, k)
    step = max(1, (1 << 22) // max(k, 1))  # rows at a time: transients stay a few megabytes
    for start in range(0, n, step):
        rows = slice(start, start + step)
        q = codes.codes[rows].view(-1, k // codes.group, codes.group).float()
        w = q * codes.d[rows].unsqueeze(-1) + codes.m[rows].unsqueeze(-1)
        out[rows] = w.view(-1, k)
    return out


def affine_codes(weight: torch.Tensor) -> AffineCodes | None:
    """Int8 codes that rebuild every float32 value of weight bit for bit, or None.

    Each 32-value chunk of a row is tried as d * q with |q| <= 127 (GGUF Q8_0: d = max |w| /
    127) and as d * q + m with 0 <= q <= 15 (Q4_1: m = the minimum, d the float16 nearest
    (max - min) / 15 or a neighbour). A chunk is kept only if d * q is exact in float32 (d is
    a float16 value, so it is) and d * q + m equals the weight; one failing chunk returns None.
    Examples: a chunk [15.875, -0.25, 0, ...] is Q8_0-like: d = 15.875 / 127 = 0.125, codes
    127, -2, 0; a chunk [-1.0, 2.75, 0.0, ...] is Q4_1-like: m = -1, d = 3.75 / 15 = 0.25,
    codes 0, 15, 4. Weights of float checkpoints fail in their first chunk, tried alone first;
    so do rows whose length is no multiple of 32 (the zeros padding the last chunk do not fit).
    """
    n, k = weight.shape
    if weight.dtype != torch.float32 or n == 0 or k == 0:
        return None
    first = _affine(weight[:1, : min(k, CODE_COLUMNS)], range(len(_FORMS)))
    if first is None:
        return None
    whole = _affine(weight, (first[1], *(i for i in range(len(_FORMS)) if i != first[1])))
    return None if whole is None else whole[0]


_FORMS = ((-127, 127, None), (0, 15, 0), (0, 15, 1), (0, 15, -1))
"""(lowest code, highest code, float16 step from (max - min) / 15 or None for Q8_0's d)."""


def _affine(weight: torch.Tensor, order: Sequence[int]) -> tuple[AffineCodes, int] | None:
    """affine_codes over the forms in order, each only for chunks no earlier form fit; also
    the form that fit the first chunk (to try first on a whole weight)."""
    n, k = weight.shape
    padded = -(-k // CODE_COLUMNS) * CODE_COLUMNS
    w = torch.nn.functional.pad(weight, (0, padded - k)).view(n, -1, CODE_COLUMNS)  # [N, C, 32]
    codes = torch.zeros_like(w, dtype=torch.int8)
    d_out = torch.zeros(n, w.shape[1], 1)
    m_out = torch.zeros_like(d_out)
    done = torch.zeros(d_out.shape, dtype=torch.bool)
    first_form = -1
    for form in order:
        lo, hi, step = _FORMS[form]
        if step is None:  # Q8_0: d = max |w| / 127, m = 0
            d = (w.abs().amax(-1, keepdim=True) / 127).half().float()
            m = torch.zeros_like(d)
        else:  # Q4_1: m = the minimum, d = (max - min) / 15 in float16, or a neighbour
            m = w.amin(-1, keepdim=True)
            d16 = ((w.amax(-1, keepdim=True) - m) / 15).half()
            d = (d16.view(torch.int16) + step).view(torch.float16).float()
            m = m.half().float()
        safe = torch.where(d == 0, torch.ones_like(d), d)
        q = torch.round((w - m) / safe).clamp_(lo, hi)
        q = torch.where(d == 0, torch.zeros_like(q), q)
        fits = ((d * q + m) == w).all(-1, keepdim=True) & ~done  # [N, C, 1]
        if first_form < 0 and bool(fits[0, 0]):
            first_form = form
        codes = torch.where(fits, q.to(torch.int8), codes)
        d_out, m_out = torch.where(fits, d, d_out), torch.where(fits, m, m_out)
        done |= fits
        if bool(done.all()):
            return AffineCodes(codes.view(n, padded), d_out.view(n, -1), m_out.view(n, -1)), (
                first_form
            )
    return None
