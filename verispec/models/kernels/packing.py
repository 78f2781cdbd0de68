"""Weights in the native kernel's layouts: float weights packed in blocks of 16 rows (`pack`),
and GGUF-style affine codes (affine.py) packed in the fewest bytes that hold them (`pack_codes`,
`pack_codes_a8`), each returned as a PackedWeight that names its WeightFormat (decided where
the layout is). arena.py copies a model's packed weights into one arena of huge pages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verispec.models.kernels import build
from verispec.models.kernels.affine import (
    CODE_COLUMNS,
    SUPER_COLUMNS,
    AffineCodes,
    Q6Scales,
    SuperScales,
)
from verispec.models.kernels.ffi import WeightFormat

ROWS = 16
"""Weight rows per packed block and columns per chunk: both dimensions are padded to this."""


def _padded(n: int) -> int:
    return -(-n // ROWS) * ROWS


@dataclass(frozen=True, eq=False)  # eq=False: fields are tensors, compare those instead
class PackedWeight:
    """One weight in a layout of the native kernel, as every packer returns it: its format
    (ffi.WeightFormat, verispec.h's enum verispec_weight_format: what linear.c and layer.c are
    told it holds), the packed codes or float values, their scales (None for F32 and F16) and
    the shape it was packed from, [out_features, in_features] (for codes, in_features is the
    codes' columns: K padded to a multiple of 32). The format is set by the packer that chose
    the layout, never inferred from dtypes and shapes.

    Example: pack(w, torch.float16) of a [20, 40] w is PackedWeight(WeightFormat.F16, codes
    [2, 3, 16, 16] float16, None, 20, 40): columns 48 (K padded to 16), bytes 20 * 40 * 2; Q4_1
    codes [37, 96] through pack_codes are WeightFormat.Q4_F16_DM, codes [3, 3, 4, 16, 4] int8
    (two a byte), scales [3, 3, 2, 16] float16 (d and m), columns 96.
    """

    format: WeightFormat
    codes: torch.Tensor
    scales: torch.Tensor | None
    out_features: int
    in_features: int

    @property
    def columns(self) -> int:
        """K', the columns the kernel reads: in_features padded to 16 (F32, F16) or 32 (codes)."""
        if self.format in (WeightFormat.F32, WeightFormat.F16):
            return self.codes.shape[1] * self.codes.shape[3]
        return self.codes.shape[1] * CODE_COLUMNS

    @property
    def bytes(self) -> int:
        """Bytes a product reads: codes (padded rows included) and scales as stored; F32 and F16
        weights count their out_features x in_features values (padding aside)."""
        if self.scales is None:
            return self.out_features * self.in_features * self.codes.element_size()
        return (self.codes.numel() * self.codes.element_size()
                + self.scales.numel() * self.scales.element_size())  # fmt: skip


def pack(weight: torch.Tensor, dtype: torch.dtype) -> PackedWeight:
    """weight [N, K] -> F32 or F16 (dtype float32, float16): values [N'/16, K'/16, 16, 16], N and
    K padded with zeros to N', K', multiples of 16.

    Example: a [2, 3] weight becomes [1, 1, 16, 16] with packed.codes[0, 0, j, l] =
    weight[j, l] for j < 2, l < 3 and 0 elsewhere.
    """
    assert dtype in (torch.float32, torch.float16), dtype
    n, k = weight.shape
    padded = torch.zeros(_padded(n), _padded(k), dtype=dtype)
    padded[:n, :k] = weight.to(dtype)
    fmt = WeightFormat.F16 if dtype == torch.float16 else WeightFormat.F32
    return PackedWeight(fmt, _row_blocks(padded, ROWS), None, n, k)


def _row_blocks(matrix: torch.Tensor, columns: int) -> torch.Tensor:
    """[N', K'] (N' a multiple of 16, K' of columns) -> [N'/16, K'/columns, 16, columns]: each
    block of 16 rows contiguous, `columns` columns at a time."""
    rows, width = matrix.shape
    blocks = matrix.view(rows // ROWS, ROWS, width // columns, columns)
    return blocks.permute(0, 2, 1, 3).contiguous()


def pack_codes(codes: AffineCodes) -> PackedWeight:
    """AffineCodes -> the kernel's codes [N'/16, K'/32, 16, 32] int8 and scales [N'/16, K'/32,
    2, 16] (d then m of the block's 16 rows), N padded with zero rows, in the fewest bytes that
    hold them (each format below gives the same products):
    - every code in 0..15 (GGUF Q4_1, Q4_K blocks): two codes a byte, codes [N'/16, K'/32, 4,
      16, 4] int8, element [b, c, v, l, r] holding the codes of row 16 b + 4 v + r at columns
      32 c + l (low 4 bits) and 32 c + 16 + l (high 4 bits), so that a 32-bit lane l holds
      column l of four rows; with float16 d and m where every d and m is a float16 value (Q4_1),
      Q4_F16_DM (0.625 bytes a weight; its decode rows look weights up in a table of 16);
      else, for Q4_K codes that carry their SuperScales, those as stored
      (`_super_scale_bytes`), Q4_SUPER_DM (0.578 bytes a weight); else float32 d and m,
      Q4_F32_DM (0.75 bytes a weight);
    - every m 0 and every d a float16 value (GGUF Q8_0 blocks): float16 d alone, scales
      [N'/16, K'/32, 1, 16], Q8_F16_D (1.0625 bytes a weight);
    - else float32 d and m, Q8_F32_DM;
    - group 16 (GGUF Q6_K, or fused weights with some parts Q6_K): codes a byte each, scales
      [N'/16, K'/32, 2, 2, 16] float32, element [b, c, h, 0 or 1, j] the d or m of row 16 b + j,
      columns 32 c + 16 h .. 32 c + 16 h + 15, Q8_F32_DM_HALVES (1.5 bytes a weight); where every m
      is +0, d alone, scales [N'/16, K'/32, 2, 1, 16], Q8_F32_D_HALVES (1.25 bytes a weight); Q6_K
      codes that carry their Q6Scales (K a multiple of 256), as the file stores them: 6-bit codes in
      two planes, d16 and sc (`pack_q6`), Q6_SUPER_D (0.8203 bytes a weight, Q8_F32_D_HALVES's
      products).

    Example: Q4_1 codes 1 at W[5, 0] and 2 at W[5, 16] pack as codes[0, 0, 1, 0, 1] = 0x21
    (row 5 = 4 * 1 + 1), format Q4_F16_DM."""
    if q6_packable(codes):
        return pack_q6(codes)
    f = WeightFormat
    four_bit = codes.group == CODE_COLUMNS and codes.four_bit
    n, k = codes.codes.shape
    packed, scales = _codes_and_scales(codes, nibbles=four_bit)

    def packed_as(fmt: WeightFormat, stored: torch.Tensor) -> PackedWeight:
        return PackedWeight(fmt, packed, stored, n, k)

    if codes.group != CODE_COLUMNS:
        if bool((scales[:, :, :, 1].view(torch.int32) == 0).all()):  # every m +0
            return packed_as(f.Q8_F32_D_HALVES, scales[:, :, :, :1].contiguous())
        return packed_as(f.Q8_F32_DM_HALVES, scales)
    half = scales.half()
    float16 = torch.equal(half.float(), scales)
    if four_bit and float16:
        return packed_as(f.Q4_F16_DM, half)
    if four_bit and codes.super_scales is not None and k % SUPER_COLUMNS == 0:
        return packed_as(f.Q4_SUPER_DM, _super_scale_bytes(codes.super_scales, packed.shape[0]))
    if four_bit:
        return packed_as(f.Q4_F32_DM, scales)
    if not float16:
        return packed_as(f.Q8_F32_DM, scales)
    if not bool(scales[:, :, 1].any()):
        return packed_as(f.Q8_F16_D, half[:, :, :1].contiguous())
    return packed_as(f.Q8_F32_DM, scales)


def _super_scale_bytes(factors: SuperScales, blocks: int) -> torch.Tensor:
    """SuperScales -> Q4_SUPER_DM and Q4_SUPER_A8 scales, uint8 [N'/16, K/256, 320]: for each
    block of 16 rows and 256 columns, d16 of the 16 rows (float16 bytes), their negmin, then
    for each of its 8 chunks sub_d of the 16 rows and their sub_m (rows past N zero).
    Example: row 17's sub_d of columns 288 .. 319 (block 1, row 1; 256 columns 1, chunk 1) is
    byte [1, 1, 64 + 32 * 1 + 1]; its sub_m the byte after the 16 rows', [1, 1, 64 + 48 + 1]."""
    rows = blocks * ROWS
    n, supers = factors.d16.shape

    def padded(t: torch.Tensor) -> torch.Tensor:
        out = torch.zeros((rows, t.shape[1]), dtype=t.dtype)
        out[:n] = t
        return out

    whole = [padded(t).view(blocks, ROWS, supers).transpose(1, 2).contiguous().view(torch.uint8)
             for t in (factors.d16, factors.negmin)]  # fmt: skip  # [B, S, 32] each
    subs = torch.stack([padded(t).view(blocks, ROWS, supers, 8).permute(0, 2, 3, 1)
                        for t in (factors.sub_d, factors.sub_m)], dim=3)  # fmt: skip
    # subs [B, S, 8 chunks, 2 (d, m), 16 rows]
    return torch.cat([*whole, subs.reshape(blocks, supers, 8 * 2 * ROWS)], dim=2).contiguous()


Q6_CHUNK_BYTES = 384
"""Bytes of Q6_SUPER_D's codes per 16 rows and 32 columns: 256 of low nibbles, 128 of high bits."""


def q6_packable(codes: AffineCodes) -> bool:
    """Whether codes pack as Q6_SUPER_D: Q6_K codes with their Q6Scales (so q in -32..31 and d =
    d16 * sc), d per 16 columns, every m +0, K a multiple of 256."""
    return (isinstance(codes.super_scales, Q6Scales) and codes.group == CODE_COLUMNS // 2
            and codes.codes.shape[1] % SUPER_COLUMNS == 0
            and not bool(codes.m.view(torch.int32).any()))  # fmt: skip


def pack_q6(codes: AffineCodes) -> PackedWeight:
    """Q6_K codes with their Q6Scales -> Q6_SUPER_D: codes as `q6_planes` [N'/16, K/32, 384]
    int8, scales `_q6_scale_bytes` [N'/16, K/256, 288] uint8; 0.8203 bytes a
    weight, as the file stores them, where Q8_F32_D_HALVES takes 1.25 for the same products."""
    factors = codes.super_scales
    assert isinstance(factors, Q6Scales) and codes.group == CODE_COLUMNS // 2
    planes = q6_planes(codes.codes)
    return PackedWeight(WeightFormat.Q6_SUPER_D, planes, _q6_scale_bytes(factors, planes.shape[0]),
                        *codes.codes.shape)  # fmt: skip


def pack_q6_a8(codes: AffineCodes) -> PackedWeight:
    """Q6_K codes with their Q6Scales -> Q6_SUPER_A8 (quantization "a8"):
    Q6_SUPER_D's planes and scales, the planes holding each block's chunk in Q8_A8's order, so
    that the position p = 64 k + 4 j + e that `q6_planes` gives row j, column l = p % 32 when
    it reads p = 32 j' + l holds instead row j, column 4 k + e (the 16 rows by 4 columns one
    vpdpbusd reads). Example: row 1, column 5 (k = 1, e = 1) is position 64 + 4 + 1 = 69,
    which Q6_SUPER_D gives row 2, column 5: so pack_q6_a8 puts it where pack_q6 puts row 2,
    column 5. 0.8203 bytes a weight."""
    factors = codes.super_scales
    assert isinstance(factors, Q6Scales) and codes.group == CODE_COLUMNS // 2
    n, k = codes.codes.shape
    rows = _padded(n)
    blocks, chunks = rows // ROWS, k // CODE_COLUMNS
    q = torch.zeros(rows, k, dtype=torch.int8)
    q[:n] = codes.codes
    # [B, 16 rows j, C, 8 groups k, 4 columns e] -> [B, C, k, j, e]: Q8_A8's order of a chunk
    order = q.view(blocks, ROWS, chunks, 8, 4).permute(0, 2, 3, 1, 4)
    as_rows = order.reshape(blocks, chunks, ROWS, CODE_COLUMNS).permute(0, 2, 1, 3)
    planes = q6_planes(as_rows.reshape(rows, k))
    return PackedWeight(WeightFormat.Q6_SUPER_A8, planes, _q6_scale_bytes(factors, blocks), n, k)


def q6_planes(q: torch.Tensor) -> torch.Tensor:
    """Codes q [N, K] int8 in -32..31 (K a multiple of 32) as Q6_SUPER_D's planes [N'/16, K/32,
    384] int8, rows past N zero bytes: of u = q + 32 (0..63, the 6-bit value Q6_K stores) for
    the 512 codes of 16 rows and 32 columns in Q8_F32_D_HALVES's order, p = 32 j + l for row j,
    column l, bytes 64 v + i (v < 4, i < 64) hold u & 15 of p = 128 v + i and, in their high nibble,
    of p = 128 v + 64 + i; bytes 256 + 64 w + i (w < 2) hold u >> 4 of p = 256 w + 64 f + i at
    bits 2 f, 2 f + 1 (f < 4). So 64 codes of Q8_F32_D_HALVES are one vector of each plane shifted
    and masked (linear.c's unpack_q6_avx512). Example: row 2, column 5 (p = 69, u = q + 32 = 0x2B)
    puts 0xB in the high nibble of byte 5 and 2 at bits 2, 3 of byte 256 + 5. One pass of
    blocks.c where the kernel loaded, else torch's reshapes (the same bytes: tested)."""
    n, k = q.shape
    rows = _padded(n)
    kernel = build.native_kernel()
    if isinstance(kernel, build.NativeKernel):
        q = q.contiguous()
        out = torch.empty(rows // ROWS, k // CODE_COLUMNS, Q6_CHUNK_BYTES, dtype=torch.int8)
        kernel.lib.verispec_pack_q6(q.data_ptr(), n, k, out.data_ptr(), torch.get_num_threads())
        return out
    u = torch.zeros(rows, k, dtype=torch.uint8)
    u[:n] = (q.to(torch.int16) + 32).to(torch.uint8)  # wraps as C's uint8_t does
    blocks, chunks = rows // ROWS, k // CODE_COLUMNS
    # Q8_F32_D_HALVES's bytes, 64 a vector
    o = _row_blocks(u, CODE_COLUMNS).view(blocks, chunks, 8, 64)
    low, high = o & 15, (o >> 4) & 3
    nibbles = low[:, :, 0::2] | (low[:, :, 1::2] << 4)  # [B, C, 4, 64]
    fields = high.view(blocks, chunks, 2, 4, 64)
    twos = (
        fields[:, :, :, 0]
        | (fields[:, :, :, 1] << 2)
        | (fields[:, :, :, 2] << 4)
        | (fields[:, :, :, 3] << 6)
    )  # [B, C, 2, 64]
    return torch.cat([nibbles.reshape(blocks, chunks, 256), twos.reshape(blocks, chunks, 128)],
                     dim=2).view(torch.int8)  # fmt: skip


def _q6_scale_bytes(factors: Q6Scales, blocks: int) -> torch.Tensor:
    """Q6Scales -> Q6_SUPER_D scales, uint8 [N'/16, K/256, 288]: for each block of 16
    rows and 256 columns, d16 of the 16 rows (float16 bytes), then for each of its 16 groups of
    16 columns sc of the 16 rows (rows past N zero). Example: row 17's sc of columns 272 ..
    287 (block 1, row 1; 256 columns 1, group 1) is byte [1, 1, 32 + 16 * 1 + 1]."""
    rows = blocks * ROWS
    n, supers = factors.d16.shape
    d16 = torch.zeros(rows, supers, dtype=torch.float16)
    d16[:n] = factors.d16
    sc = torch.zeros(rows, supers * 16, dtype=torch.int8)
    sc[:n] = factors.sc
    whole = d16.view(blocks, ROWS, supers).transpose(1, 2).contiguous().view(torch.uint8)
    groups = sc.view(blocks, ROWS, supers, 16).permute(0, 2, 3, 1).reshape(blocks, supers, 256)
    return torch.cat([whole, groups.view(torch.uint8)], dim=2).contiguous()


def packed_code_bytes(q: torch.Tensor, nibbles: bool) -> torch.Tensor:
    """Codes q [N, K] int8 (K a multiple of 32) in the kernel's blocks, N padded with zero rows
    to N': [N'/16, K/32, 16, 32], or with nibbles (every code in 0..15) two a byte [N'/16, K/32,
    4, 16, 4] (`pack_codes` gives the layouts). One pass of blocks.c where the kernel loaded,
    else the same bytes by torch's reshapes."""
    n, k = q.shape
    rows = _padded(n)
    kernel = build.native_kernel()
    if isinstance(kernel, build.NativeKernel):
        q = q.contiguous()
        shape = (rows // ROWS, k // CODE_COLUMNS, 4, ROWS, 4) if nibbles else (
            rows // ROWS, k // CODE_COLUMNS, ROWS, CODE_COLUMNS)  # fmt: skip
        out = torch.empty(shape, dtype=torch.int8)
        kernel.lib.verispec_pack_codes(q.data_ptr(), n, k, int(nibbles), out.data_ptr(),
                                       torch.get_num_threads())  # fmt: skip
        return out
    padded = torch.zeros(rows, k, dtype=torch.int8)
    padded[:n] = q
    packed = _row_blocks(padded, CODE_COLUMNS)
    if not nibbles:
        return packed
    low, high = packed[..., : CODE_COLUMNS // 2], packed[..., CODE_COLUMNS // 2 :]
    pairs = low | (high << 4)  # [B, C, 16, 16]: row j, column l (int8 bits)
    blocks, chunks = packed.shape[:2]
    return pairs.view(blocks, chunks, 4, 4, 16).transpose(3, 4).contiguous()


def _codes_and_scales(
    codes: AffineCodes, nibbles: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """pack_codes' codes (two a byte with nibbles) and its scales as float32 d and m: Q8_F32_DM's,
    or for group 16 Q8_F32_DM_HALVES's [N'/16, K'/32, 2, 2, 16]."""
    assert codes.group in (CODE_COLUMNS, CODE_COLUMNS // 2), codes.group
    n, k = codes.codes.shape
    rows = _padded(n)
    dm = torch.zeros(2, rows, k // codes.group)
    dm[0, :n], dm[1, :n] = codes.d, codes.m
    packed = packed_code_bytes(codes.codes, nibbles)
    chunks = k // CODE_COLUMNS
    if codes.group == CODE_COLUMNS:
        scales = dm.view(2, -1, ROWS, chunks).permute(1, 3, 0, 2).contiguous()
    else:  # [2 (d, m), B, 16, C, 2 (h)] -> [B, C, h, d or m, 16]
        scales = dm.view(2, -1, ROWS, chunks, 2).permute(1, 3, 4, 0, 2).contiguous()
    return packed, scales


def a8_packable(codes: AffineCodes) -> bool:
    """Whether codes have an a8 format's form: one d and m per 32 columns (GGUF Q4_0, Q4_1, Q5_0,
    Q5_1, Q8_0, Q4_K, Q5_K), or Q6_K codes with their Q6Scales (`q6_packable`, Q6_SUPER_A8);
    `pack_codes_a8` refuses the others (d and m per 16 columns without Q6_K's factors)."""
    return codes.group == CODE_COLUMNS or q6_packable(codes)


def pack_codes_a8(codes: AffineCodes) -> PackedWeight:
    """AffineCodes -> Q8_A8, whose products round x to 8-bit blocks (quantization "a8"):
    codes + 128 as uint8 [N'/16, K'/32, 8, 16, 4], element [b, c, k, j, e] the code of
    W[16 b + j, 32 c + 4 k + e] (4 columns of 16 rows per 64 bytes, as vpdpbusd
    reads them); scales d and m as `pack_codes` lays them out, in float16, which holds every d
    and m exactly (affine_codes takes them from float16, as GGUF stores them): 1.125 bytes a
    weight instead of 1.25. Example: a Q8_0 code -3 is stored as 125.
    Codes all in 0..15 (GGUF Q4_1 blocks) go two a byte as themselves, Q4_A8: uint8
    [N'/16, K'/32, 4, 16, 4], element [b, c, k, j, e] = the code of W[16 b + j, 32 c + 4 k + e]
    | that of W[16 b + j, 32 c + 16 + 4 k + e] << 4 (0.625 bytes a weight).
    Where some d or m is no float16 value (GGUF Q4_K, Q5_K: products of a float16 and a 6-bit
    scale) the scales stay float32, Q4_F32_A8 (4-bit codes, 0.75 bytes a weight) and
    Q8_F32_A8 (8-bit, 1.25): the same operations on the same values as Q4_A8 and Q8_A8; Q4_K
    codes that carry their SuperScales keep them as stored, Q4_SUPER_A8 (0.578 bytes a
    weight, Q4_F32_A8's products).
    Q6_K codes that carry their Q6Scales go as the file stores them, in Q8_A8's order
    (`pack_q6_a8`, Q6_SUPER_A8: 0.8203 bytes a weight).
    Raises ValueError for other codes whose d and m change every 16 columns: the other a8 formats
    store one d and m per 32 columns."""
    if q6_packable(codes):
        return pack_q6_a8(codes)
    if codes.group != CODE_COLUMNS:
        raise ValueError(f"quantization a8 needs one d and m per {CODE_COLUMNS} columns; these "
                         f"codes have one per {codes.group} (GGUF Q6_K blocks)")  # fmt: skip
    f = WeightFormat
    packed, scales = _codes_and_scales(codes)
    nibbles = codes.four_bit
    half = scales.half()
    fmt = f.Q4_A8 if nibbles else f.Q8_A8
    if not torch.equal(half.float(), scales):
        half = scales  # K-quants: float32 d and m
        fmt = f.Q4_F32_A8 if nibbles else f.Q8_F32_A8
        if (codes.super_scales is not None and nibbles
                and codes.codes.shape[1] % SUPER_COLUMNS == 0):  # fmt: skip
            half = _super_scale_bytes(codes.super_scales, packed.shape[0])
            fmt = f.Q4_SUPER_A8
    blocks, chunks = packed.shape[:2]
    unsigned = packed.to(torch.uint8) if nibbles else (packed.to(torch.int16) + 128).to(torch.uint8)
    grouped = unsigned.view(blocks, chunks, ROWS, CODE_COLUMNS // 4, 4).permute(0, 1, 3, 2, 4)
    if nibbles:  # [B, C, 8, 16, 4]: vectors k and k + 4 share a byte
        grouped = grouped[:, :, :4] | (grouped[:, :, 4:] << 4)
    return PackedWeight(fmt, grouped.contiguous(), half, *codes.codes.shape)
