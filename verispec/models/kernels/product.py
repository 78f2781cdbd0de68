"""The native linear kernel's product (native/linear.c): y = x W^T + b over a weight packed by
packing.py, called through ctypes, for the few-row products of decode and verify steps.

Why: on a 2-core CPU a decode step is bound by streaming the weights, and torch's kernels read
float32 weights at about 0.9 and float16 ones at about 0.6 of what a plain `torch.sum` reads.
This kernel reads a packed copy front to back, 16 weight rows at a time, in the fewest bytes
that hold every value exactly (8-bit affine codes for weights dequantized from GGUF blocks,
float16, or float32), near the read bandwidth (docs/benchmarks.md, `linear_kernels.py`).
Its results are also row-invariant: a row of a verify step is bit-for-bit the decode step of
the same input, so the batch-invariant mode needs no row-by-row products.
"""

from __future__ import annotations

import torch

from verispec.models.kernels.build import NativeKernel, loaded
from verispec.models.kernels.ffi import WeightFormat
from verispec.models.kernels.packing import PackedWeight

CHUNK_ROWS = 128
"""Rows of x per kernel pass (linear.c's CHUNK_ROWS): every weight block re-reads the pass's
rows, which must stay in the core's cache (512-row prefill chunks ran 1.2x faster split in
four; rows are independent, so splitting changes no result)."""


def product(x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """x [T, K] float32 -> x W^T + b [T, N] with W packed by one of packing.py's packers (its
    format tells the kernel what the codes and scales hold); the kernel is loaded where these
    exist.

    Under torch.compile the call goes through the operator `verispec::native_linear`, which the
    compiler keeps as one opaque call (it takes the PackedWeight's fields: operators take
    tensors and ints); eager calls skip the operator's dispatch cost.
    """
    if torch.compiler.is_compiling():
        return native_linear_op(x, packed.codes, packed.scales, bias, int(packed.format),
                                packed.out_features, packed.in_features)  # fmt: skip
    return product_on(loaded(), x, packed, bias)


def product_on(
    kernel: NativeKernel, x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None
) -> torch.Tensor:
    """`product` on the given kernel (build.loaded()'s, or one instruction set's to compare
    them), eagerly: x padded to the packed columns, one native call."""
    columns = packed.columns  # K'
    x = x.contiguous()
    if x.shape[1] != columns:
        x = torch.nn.functional.pad(x, (0, columns - x.shape[1]))
    rows, scales = x.shape[0], packed.scales
    y = torch.empty(rows, packed.out_features, dtype=torch.float32)
    kernel.lib.verispec_linear(kernel.isa_arg, int(packed.format), x.data_ptr(),
                               packed.codes.data_ptr(),
                               None if scales is None else scales.data_ptr(),
                               None if bias is None else bias.data_ptr(), y.data_ptr(), rows,
                               packed.out_features, columns, torch.get_num_threads())  # fmt: skip
    return y


@torch.library.custom_op("verispec::native_linear", mutates_args=())
def native_linear_op(
    x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor | None, bias: torch.Tensor | None,
    format: int, out_features: int, in_features: int,
) -> torch.Tensor:
    """`product` as an operator torch.compile can place in a graph: the PackedWeight's fields,
    its format as WeightFormat's int."""
    packed = PackedWeight(WeightFormat(format), codes, scales, out_features, in_features)
    return product_on(loaded(), x, packed, bias)


@native_linear_op.register_fake
def _fake(
    x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor | None, bias: torch.Tensor | None,
    format: int, out_features: int, in_features: int,
) -> torch.Tensor:
    """The operator's output shape, for the compiler's tracing."""
    return x.new_empty(x.shape[0], out_features)
