"""Linear: y = x W^T + b with the fastest exact kernel the device has for decode and verify
(chosen by backends.py), and the native kernel's packed weights of a model moved together."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import cast

import torch

from verispec.models.kernels import affine, arena, build, packing, product
from verispec.models.kernels.affine import AffineCodes, dequantize_codes
from verispec.models.kernels.backends import exactly_fp16, kernel_for, native_usable
from verispec.models.kernels.ffi import WeightFormat
from verispec.models.kernels.packing import PackedWeight
from verispec.models.kernels.quantization import (
    int8_per_channel,
    round_to_fp16,
    round_to_q4_1,
    round_to_q8_0,
)
from verispec.types.numerics import ACTIVATION_QUANTIZATIONS

PACK_ROWS = 2048
"""Rows of codes packed at a time (a multiple of the kernel's 16-row blocks)."""


def pack_codes_by_rows(
    codes: AffineCodes, packer: Callable[[AffineCodes], PackedWeight] = packing.pack_codes
) -> PackedWeight:
    """packer (packing.pack_codes or pack_codes_a8), PACK_ROWS rows at a time into one
    preallocated output, so a large weight (a 150k-row LM head) never has several whole copies
    alive while it packs.
    The packed layout is blocked by 16 rows, so the pieces are the whole's rows; if a piece
    would pick another format than the first (e.g. one whose m happen to be all zero), the
    whole weight is packed at once instead."""
    rows = codes.codes.shape[0]
    if rows <= PACK_ROWS:
        return packer(codes)
    pieces = range(0, rows, PACK_ROWS)

    def piece(start: int) -> PackedWeight:
        return packer(codes.rows(slice(start, start + PACK_ROWS)))

    def layout(p: PackedWeight) -> tuple:
        sc = cast(torch.Tensor, p.scales)  # codes always have scales
        return p.format, p.codes.dtype, p.codes.shape[1:], sc.dtype, sc.shape[1:]

    first = piece(0)
    first_s = cast(torch.Tensor, first.scales)
    blocks = -(-rows // packing.ROWS)
    weight = torch.empty((blocks, *first.codes.shape[1:]), dtype=first.codes.dtype)
    scales = torch.empty((blocks, *first_s.shape[1:]), dtype=first_s.dtype)
    for start in pieces:
        p = first if start == 0 else piece(start)
        if layout(p) != layout(first):
            return packer(codes)
        at = start // packing.ROWS
        weight[at : at + p.codes.shape[0]] = p.codes
        scales[at : at + cast(torch.Tensor, p.scales).shape[0]] = p.scales
    return dataclasses.replace(first, codes=weight, scales=scales, out_features=rows)


WEIGHT_FORMATS = {
    WeightFormat.F32: "float32",
    WeightFormat.F16: "float16",
    WeightFormat.Q8_F32_DM: "8-bit codes, float32 d and m (Q5_1, Q5_K)",
    WeightFormat.Q8_A8: "8-bit codes times 8-bit inputs (a8)",
    WeightFormat.Q4_F16_DM: "4-bit codes, float16 d and m (Q4_0, Q4_1)",
    WeightFormat.Q8_F16_D: "8-bit codes, float16 d (Q8_0, Q5_0)",
    WeightFormat.Q4_A8: "4-bit codes times 8-bit inputs (a8)",
    WeightFormat.Q4_F32_DM: "4-bit codes, float32 d and m (Q4_K)",
    WeightFormat.Q8_F32_DM_HALVES: "8-bit codes, d and m per 16 columns (Q6_K beside others)",
    WeightFormat.Q8_F32_D_HALVES: "8-bit codes, d per 16 columns (Q6_K)",
    WeightFormat.Q4_F32_A8: "4-bit codes, float32 d and m, times 8-bit inputs (Q4_K, a8)",
    WeightFormat.Q8_F32_A8: "8-bit codes, float32 d and m, times 8-bit inputs (Q5_K, a8)",
    WeightFormat.Q4_SUPER_DM: "4-bit codes, d and m as stored (Q4_K)",
    WeightFormat.Q4_SUPER_A8: "4-bit codes, d and m as stored, times 8-bit inputs (Q4_K, a8)",
    WeightFormat.Q6_SUPER_D: "6-bit codes, d as stored (Q6_K)",
    WeightFormat.Q6_SUPER_A8: "6-bit codes, d as stored, times 8-bit inputs (Q6_K, a8)",
}
"""What each of the native kernel's weight formats holds, for the settings users see."""
A8_FORMATS = (WeightFormat.Q8_A8, WeightFormat.Q4_A8, WeightFormat.Q4_F32_A8,
              WeightFormat.Q8_F32_A8, WeightFormat.Q4_SUPER_A8, WeightFormat.Q6_SUPER_A8)


def kernels_in_use(linears: Sequence[Linear]) -> dict[str, str]:
    """Which kernel each weight format of these layers runs with, e.g. {"4-bit codes, float32
    d and m (Q4_K)": "native avx2", "4-bit codes, d and m as stored, times 8-bit inputs (Q4_K,
    a8)": "native avx2 maddubs"}: the instruction sets and, for 8-bit inputs, the integer dot
    product (build.DOT_NAMES); printed in `verispec generate --json` settings and the server's
    start line, so a figure always says what computed it."""
    used: dict[str, str] = {}
    for lin in linears:
        if lin.kernel != "native":
            weight = lin.weight
            stored = str(weight.dtype) if isinstance(weight, torch.Tensor) else "packed"
            used[stored.removeprefix("torch.")] = lin.kernel
            continue
        kernel = build.loaded()
        fmt = cast(PackedWeight, lin.packed).format
        name = f"native {kernel.isa_name}"
        if fmt in A8_FORMATS:
            name += f" {kernel.dot_name}"
        used[WEIGHT_FORMATS[fmt]] = name
    return dict(sorted(used.items()))


_MOVING = torch.empty(0)
"""A packed weight's codes or scales placeholder while pack_together moves them into an arena."""


def pack_together(linears: Sequence[Linear]) -> None:
    """Move the packed weights (PackedWeight.codes) of the native-kernel layers among linears,
    in this order (the order a forward runs them), into one arena per dtype
    (arena.into_arena); the scales of affine codes go into one more per dtype. Refuses "a8"
    for a model none of whose weights are 8-bit codes (every product would then ignore it)."""
    native = [lin for lin in linears if lin.kernel == "native"]
    rounded = [lin for lin in linears if lin.quantization in ACTIVATION_QUANTIZATIONS]
    if rounded and not any(cast(PackedWeight, lin.packed).format in A8_FORMATS
                           for lin in rounded if lin.kernel == "native"):  # fmt: skip
        raise ValueError(
            f"quantization={rounded[0].quantization!r} multiplies 8-bit weight codes by 8-bit "
            "inputs, but no weight of this model is stored as codes (GGUF Q4_1 or Q8_0 "
            "blocks); use quantization='w8a8' to round the weights to q8_0 first"
        )

    def packed_of(lin: Linear) -> PackedWeight:
        return cast(PackedWeight, lin.packed)

    for dtype in (torch.int8, torch.uint8, torch.float16, torch.float32):
        some = [lin for lin in native if packed_of(lin).codes.dtype == dtype]
        codes = [packed_of(lin).codes for lin in some]
        for lin in some:  # the list alone holds them, so into_arena frees each once copied
            lin.packed = dataclasses.replace(packed_of(lin), codes=_MOVING)
        for lin, moved in zip(some, arena.into_arena(codes), strict=True):
            lin.packed = dataclasses.replace(packed_of(lin), codes=moved)
    for dtype in (torch.float32, torch.float16, torch.uint8):  # d and m: float32, float16 or
        # (formats 12, 13 and 14) their factors as a Q4_K or Q6_K file stores them
        coded = [lin for lin in native if (s := packed_of(lin).scales) is not None
                 and s.dtype == dtype]  # fmt: skip
        scales = [cast(torch.Tensor, packed_of(lin).scales) for lin in coded]
        for lin in coded:
            lin.packed = dataclasses.replace(packed_of(lin), scales=_MOVING)
        for lin, moved in zip(coded, arena.into_arena(scales), strict=True):
            lin.packed = dataclasses.replace(packed_of(lin), scales=moved)


class Linear:
    """A frozen linear layer; weight [out, in] as stored by Hugging Face, bias [out] or None.
    The native kernel's layers hold their weight as `packed` (a PackedWeight), the others as
    `weight` (a tensor, or the prepacked object of oneDNN or FBGEMM)."""

    def __init__(
        self,
        weight: torch.Tensor | AffineCodes,
        bias: torch.Tensor | None,
        backend: str,
        row_wise: bool = False,
        quantization: str | None = None,
    ) -> None:
        codes = None  # a GGUF file's codes, computed as stored where the native kernel runs
        if isinstance(weight, AffineCodes):
            keep = backend in ("auto", "native") and native_usable()
            if keep and quantization in (None, "a8", "w8a8"):
                codes = weight
            elif quantization == "w4a8":  # rounded from the codes, a few rows at a time
                codes = round_to_q4_1(weight)
            weight = dequantize_codes(weight) if codes is None else weight.codes
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        if quantization == "fp16":
            weight = round_to_fp16(weight)
        elif quantization in ("q8_0", "w8a8"):
            weight = round_to_q8_0(weight)
        elif quantization == "w4a8" and codes is None:  # the native kernel's only (kernel_for)
            codes = round_to_q4_1(weight)
        self.quantization = quantization
        self.kernel = kernel_for(backend, weight, quantization)
        self.row_wise = row_wise and self.kernel != "native"
        """Batch-invariant mode: each row is its own 1-row product, so its result is bit-for-bit
        what a lone decode step computes (kernels may round an n-row product differently). The
        native kernel computes every row that way already (row-invariant), so it never splits."""
        self.weight: torch.Tensor | torch.ScriptObject | None = None  # all kernels but native
        self.packed: PackedWeight | None = None  # the native kernel's weight
        self.scale: torch.Tensor | None = None  # [out], int8 only
        if self.kernel == "int8":
            self.weight, self.scale = int8_per_channel(weight.detach())
        elif self.kernel == "onednn":
            # Reordered once into oneDNN's blocked layout; the original weight is not kept.
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
        elif self.kernel == "native":
            # Packed once into the kernel's blocks, in the fewest bytes that hold every value
            # exactly: a GGUF file's codes as stored (or codes found in dequantized values),
            # else float16, else float32. The original weight is not kept.
            if codes is None:
                codes = affine.affine_codes(weight.detach())
            a8 = quantization in ACTIVATION_QUANTIZATIONS
            if codes is not None and a8 and packing.a8_packable(codes):
                self.packed = pack_codes_by_rows(codes, packing.pack_codes_a8)
            elif codes is not None:
                self.packed = pack_codes_by_rows(codes)
            else:
                dtype = torch.float16 if exactly_fp16(weight) else torch.float32
                self.packed = packing.pack(weight.detach(), dtype)
        elif self.kernel == "fp16":
            # FBGEMM's packed float16 copy (bias stays float32 inside it); products accumulate
            # in float32, so the result is the float32 product of the same weight values.
            self.weight = torch.ops.quantized.linear_prepack_fp16(weight.detach(), bias)
        else:
            self.weight = weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] -> [T, out]."""
        if self.row_wise and x.shape[0] > 1:
            return torch.cat([self._product(x[i : i + 1]) for i in range(x.shape[0])])
        return self._product(x)

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel == "native":
            return product.product(x, cast(PackedWeight, self.packed), self.bias)
        if self.kernel == "int8":
            y = torch._weight_int8pack_mm(x, self.weight, self.scale)
            return y if self.bias is None else y + self.bias
        if self.kernel == "fp16":
            return torch.ops.quantized.linear_dynamic_fp16(x, self.weight)
        if self.kernel == "onednn":
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return torch.nn.functional.linear(x, self.weight, self.bias)
