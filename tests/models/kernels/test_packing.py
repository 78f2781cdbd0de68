"""The native linear kernel's packed layouts (packing.py) and its products over them
(product.py): against float64 on both instruction sets, and row invariance (the property
batch-invariant mode and verification rely on). Its build is tested in test_build.py."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.helpers.checkpoints import make_checkpoint
from tests.helpers.harness import Runner, assert_runs_match
from verispec.models.kernels import affine, arena, build, ffi, packing, product
from verispec.models.kernels.backends import choose_backend
from verispec.models.kernels.build import NativeKernel, native_kernel
from verispec.models.kernels.linear import Linear, pack_together
from verispec.models.kernels.native_layer import NativeStack
from verispec.models.kernels.packing import PackedWeight, pack
from verispec.models.kernels.quantization import round_to_q8_0
from verispec.models.weights.loader import load_model

CPU = torch.device("cpu")
F = ffi.WeightFormat
KERNEL = native_kernel()
needs_kernel = pytest.mark.skipif(
    not isinstance(KERNEL, NativeKernel),
    reason=f"the native kernel cannot run here: {getattr(KERNEL, 'reason', '')}",
)


def kernels() -> list[NativeKernel]:
    """The loaded kernel on every instruction set and 8-bit dot product this CPU can run
    (NativeKernel.paths: AVX-512 CPUs run AVX2 too, every CPU the 8-bit products' scalar loop)."""
    assert isinstance(KERNEL, NativeKernel)
    return KERNEL.paths()


def test_pack_worked_example() -> None:
    w = torch.arange(6, dtype=torch.float32).view(2, 3)
    p = pack(w, torch.float16)
    packed = p.codes
    assert (p.format, p.scales, p.out_features, p.in_features, p.columns) == (F.F16, None, 2, 3,
                                                                              16)  # fmt: skip
    assert packed.shape == (1, 1, 16, 16) and packed.dtype == torch.float16
    assert torch.equal(packed[0, 0, :2, :3].float(), w)
    assert packed.float().sum() == w.sum()  # the padding is zeros
    wide = torch.randn(20, 40)  # two row blocks, three column chunks
    p = pack(wide, torch.float32)
    packed = p.codes
    assert (p.format, p.columns, p.bytes) == (F.F32, 48, 20 * 40 * 4)
    assert packed.shape == (2, 3, 16, 16)
    assert torch.equal(packed[1, 2, 3, 5], wide[16 + 3, 32 + 5])
    assert pack(wide, torch.float16).bytes == 20 * 40 * 2  # PackedWeight's docstring example


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("out", "inp"), [(96, 80), (37, 50), (16, 16), (5, 1536)])
def test_products_match_float64_on_every_instruction_set(
    dtype: torch.dtype, out: int, inp: int
) -> None:
    g = torch.Generator().manual_seed(out * inp)
    w = (torch.randn(out, inp, generator=g) * 0.05).to(dtype).float()
    b = torch.randn(out, generator=g)
    packed = pack(w, dtype)
    for kernel in kernels():
        for rows in (1, 2, 3, 5, 8, 17):
            x = torch.randn(rows, inp, generator=g)
            got = product.product_on(kernel, x, packed, b)
            expected = x.double() @ w.double().T + b.double()
            torch.testing.assert_close(got.double(), expected, atol=2e-5, rtol=0)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_every_row_is_its_one_row_product(dtype: torch.dtype) -> None:
    """Row invariance: a row's result never depends on the call's other rows or its place."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(50, 1536, generator=g).to(dtype).float()
    packed = pack(w, dtype)
    x = torch.randn(11, 1536, generator=g)
    for kernel in kernels():
        whole = product.product_on(kernel, x, packed, None)
        for i in range(11):
            alone = product.product_on(kernel, x[i : i + 1], packed, None)
            assert torch.equal(alone[0], whole[i]), (kernel.isa_name, i)
        shifted = product.product_on(kernel, x[3:9], packed, None)
        assert torch.equal(shifted, whole[3:9]), kernel.isa_name


@needs_kernel
def test_batch_invariant_layers_need_no_row_splitting() -> None:
    linear = Linear(torch.randn(8, 32), None, "native", row_wise=True)
    assert linear.kernel == "native" and not linear.row_wise


def test_it_needs_float32_on_the_cpu() -> None:
    with pytest.raises(ValueError, match="native linear backend computes in float32 on the CPU"):
        choose_backend("native", CPU, torch.bfloat16)


def test_the_arena_keeps_values_and_order_on_aligned_huge_pages() -> None:
    packed = [pack(torch.randn(n, 40), torch.float16).codes for n in (20, 7, 33)]
    moved = arena.into_arena(packed)
    assert all(torch.equal(a, b) for a, b in zip(moved, packed, strict=True))
    assert moved[0].data_ptr() % arena.HUGE_PAGE == 0
    for before, after in itertools.pairwise(moved):  # consecutive, in the order given
        assert after.data_ptr() == before.data_ptr() + before.numel() * before.element_size()


@needs_kernel
def test_pack_together_leaves_every_product_unchanged() -> None:
    g = torch.Generator().manual_seed(5)
    layers = [
        Linear(torch.randn(n, k, generator=g).to(dtype).float(), None, "native")
        for n, k, dtype in ((24, 32, torch.float16), (16, 48, torch.float32), (40, 32, torch.half))
    ]
    x = {k: torch.randn(3, k, generator=g) for k in (32, 48)}
    before = [lin(x[lin.in_features]) for lin in layers]
    pack_together(layers)
    first, third = (lin.packed.codes for lin in layers[::2])  # float16 ones share an arena, in
    # order; the format and shape stay those packed
    assert [(lin.packed.format, lin.packed.out_features) for lin in layers] == [
        (F.F16, 24), (F.F32, 16), (F.F16, 40)]  # fmt: skip
    assert third.data_ptr() == first.data_ptr() + 2 * first.numel()
    for lin, y in zip(layers, before, strict=True):
        assert torch.equal(lin(x[lin.in_features]), y)


@needs_kernel
def test_long_inputs_split_into_calls_without_changing_a_row() -> None:
    g = torch.Generator().manual_seed(9)
    w = torch.randn(24, 64, generator=g)
    packed = pack(w, torch.float32)
    x = torch.randn(product.CHUNK_ROWS * 2 + 5, 64, generator=g)
    whole = product.product(x, packed, None)
    for i in (0, product.CHUNK_ROWS - 1, product.CHUNK_ROWS, x.shape[0] - 1):
        assert torch.equal(product.product(x[i : i + 1], packed, None)[0], whole[i])
    torch.testing.assert_close(whole.double(), x.double() @ w.double().T, atol=2e-5, rtol=0)


def gguf_like(rows: int, chunks: int, seed: int) -> torch.Tensor:
    """Q4_1-style values: per 32 columns d * q + m with float16 d and m, q in 0..15."""
    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(rows, chunks, 1, generator=g) * 0.05).half().float()
    m = (-torch.rand(rows, chunks, 1, generator=g) * 0.4).half().float()
    q = torch.randint(0, 16, (rows, chunks, 32), generator=g).float()
    q[..., 0], q[..., 1] = 0, 15  # as the quantizer leaves them: min and max of each block
    return (d * q + m).view(rows, chunks * 32)


def test_affine_codes_worked_examples() -> None:
    q8 = torch.zeros(1, 32)
    q8[0, :3] = torch.tensor([15.875, -0.25, 0.0])
    codes = affine.affine_codes(q8)
    assert codes is not None and codes.codes[0, :3].tolist() == [127, -2, 0]
    assert codes.d.item() == 0.125 and codes.m.item() == 0.0
    q41 = torch.full((1, 32), -1.0)
    q41[0, :3] = torch.tensor([-1.0, 2.75, 0.0])
    codes = affine.affine_codes(q41)
    assert codes is not None and codes.codes[0, :3].tolist() == [0, 15, 4]
    assert (codes.d.item(), codes.m.item()) == (0.25, -1.0)
    assert affine.affine_codes(torch.randn(4, 64)) is None  # plain float weights
    assert affine.affine_codes(gguf_like(4, 2, 0)[:, :40]) is None  # rows of 40


def test_affine_codes_rebuild_every_value_exactly() -> None:
    w = gguf_like(20, 3, 1)
    codes = affine.affine_codes(w)
    assert codes is not None
    rebuilt = codes.d.repeat_interleave(32, 1) * codes.codes.float() + codes.m.repeat_interleave(
        32, 1
    )
    assert torch.equal(rebuilt, w)


@needs_kernel
def test_coded_products_match_float64_and_are_row_invariant() -> None:
    w = gguf_like(37, 3, 2)
    bias = torch.randn(37)
    linear = Linear(w, bias, "native")
    packed = linear.packed
    assert packed is not None and packed.format == F.Q4_F16_DM  # two codes a byte
    g = torch.Generator().manual_seed(4)
    x = torch.randn(40, 96, generator=g)  # 40 rows: prefill-sized calls unpack each block once
    for kernel, b in itertools.product(kernels(), (bias, None)):
        alone = [product.product_on(kernel, x[i : i + 1], packed, b)[0] for i in range(40)]
        # 2-8 rows: tiles of 4 x 4 and their remainders (and 37 outputs: a part block); 40:
        # each block unpacked once.
        for rows in (2, 3, 4, 5, 8, 9, 40):
            whole = product.product_on(kernel, x[:rows], packed, b)
            expected = x[:rows].double() @ w.double().T + (0 if b is None else b.double())
            torch.testing.assert_close(whole.double(), expected, atol=2e-5, rtol=0)
            for i in range(rows):
                assert torch.equal(alone[i], whole[i]), (kernel.isa_name, rows, i)


def test_4_bit_codes_layout() -> None:
    """Q4_F16_DM packs two codes a byte, lane l of vector v holding columns l and 16 + l of rows
    4 v .. 4 v + 3: the worked example of pack_codes' docstring, then every code of a random
    weight found where the layout says."""
    codes = torch.zeros(6, 32, dtype=torch.int8)
    codes[5, 0], codes[5, 16] = 1, 2
    ones = torch.ones(6, 1)
    p = packing.pack_codes(affine.AffineCodes(codes, ones, 0 * ones))
    packed = p.codes
    assert packed.shape == (1, 1, 4, 16, 4) and packed.dtype == torch.int8
    assert packed[0, 0, 1, 0, 1] == 0x21 and int(packed.sum()) == 0x21
    assert p.format == F.Q4_F16_DM
    w = gguf_like(37, 3, 5)
    codes_of = affine.affine_codes(w)
    assert codes_of is not None
    p = packing.pack_codes(codes_of)
    assert (p.format, p.out_features, p.in_features, p.columns) == (F.Q4_F16_DM, 37, 96, 96)
    assert p.scales is not None and p.scales.shape == (3, 3, 2, 16)  # the docstring's example
    assert p.scales.dtype == torch.float16
    packed = p.codes
    b, c, v, lane, r, high = torch.meshgrid(
        *(torch.arange(n) for n in (3, 3, 4, 16, 4, 2)), indexing="ij"
    )
    row, col = 16 * b + 4 * v + r, 32 * c + lane + 16 * high
    nibble = (packed.view(torch.uint8)[b, c, v, lane, r].int() >> (4 * high)) & 15
    inside = row < 37
    assert torch.equal(nibble[inside], codes_of.codes[row[inside], col[inside]].int())
    assert not bool(nibble[~inside].any())  # padding rows are zeros


@needs_kernel
@pytest.mark.parametrize("out", [37, 64])
@pytest.mark.parametrize("form", ["q4_1", "q8_0"])
def test_float16_scales_give_the_float32_scales_products(form: str, out: int) -> None:
    """Q4_1-like codes pack two a byte with float16 d and m (Q4_F16_DM, whose decode rows look
    weights up in a table), Q8_0-like codes with float16 d alone (Q8_F16_D); both give, bit for
    bit, the products of the same codes a byte each with float32 d and m (Q8_F32_DM) on every
    instruction set and for every row count."""
    g = torch.Generator().manual_seed(8)
    w = gguf_like(out, 3, 7) if form == "q4_1" else round_to_q8_0(torch.randn(out, 96, generator=g))
    codes = affine.affine_codes(w)
    assert codes is not None
    packed = packing.pack_codes(codes)
    fmt, rows_of_scales = (F.Q4_F16_DM, 2) if form == "q4_1" else (F.Q8_F16_D, 1)
    half = packed.scales
    assert half is not None and half.dtype == torch.float16 and half.shape[2] == rows_of_scales
    assert packed.format == fmt
    bytes_each, full = packing._codes_and_scales(codes)
    assert full.dtype == torch.float32
    twin = replace(packed, format=F.Q8_F32_DM, codes=bytes_each, scales=full)  # Q8_F32_DM
    assert packed.codes.numel() == bytes_each.numel() // (2 if form == "q4_1" else 1)
    x = torch.randn(40, 96, generator=g)
    bias = torch.randn(out, generator=g)
    for kernel in kernels():
        for rows in (1, 2, 3, 4, 5, 8, 9, 40):
            got = product.product_on(kernel, x[:rows], packed, bias)
            want = product.product_on(kernel, x[:rows], twin, bias)
            assert torch.equal(got, want), (kernel.isa_name, rows)
            expected = x[:rows].double() @ w.double().T + bias.double()
            torch.testing.assert_close(got.double(), expected, atol=5e-5, rtol=0)


def round_rows_like_the_kernel(x: torch.Tensor) -> torch.Tensor:
    """x [T, K] with each 32-column chunk rounded as quantization "a8" rounds it (linear.c):
    d = max |x| / 127, q = x * (127 / max |x|) to the nearest integer, ties to even."""
    chunks = x.view(x.shape[0], -1, 32)
    amax = chunks.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    return (torch.round(chunks * inv) * (amax / 127)).view_as(x)


def test_a8_codes_layout_worked_example() -> None:
    w = torch.zeros(2, 32)
    w[1, 5] = 15.875  # Q8_0 block: d = 0.125, code 127
    w[1, 6] = -0.25  # code -2
    codes = affine.affine_codes(w)
    assert codes is not None
    p = packing.pack_codes_a8(codes)
    packed, scales = p.codes, p.scales
    assert p.format == F.Q8_A8 and scales is not None
    assert packed.shape == (1, 1, 8, 16, 4) and packed.dtype == torch.uint8
    # column 5 = 4 * 1 + 1, column 6 = 4 * 1 + 2: group 1, row 1; codes + 128
    assert packed[0, 0, 1, 1, 1] == 255 and packed[0, 0, 1, 1, 2] == 126
    assert packed[0, 0, 0, 0, 0] == 128  # a zero code
    assert scales[0, 0, 0, 1] == 0.125 and p.columns == 32


def test_a8_4_bit_codes_layout_worked_example() -> None:
    """Codes in 0..15 go two a byte (Q4_A8): column 32 c + 4 k + e in the low 4 bits of [b, c,
    k, j, e], column 32 c + 16 + 4 k + e in the high 4 bits, stored as themselves."""
    codes = torch.zeros(2, 32, dtype=torch.int8)
    codes[1, 5], codes[1, 21] = 3, 15  # columns 4 * 1 + 1 and 16 + 4 * 1 + 1
    ones = torch.ones(2, 1)
    p = packing.pack_codes_a8(affine.AffineCodes(codes, ones, 0 * ones))
    packed = p.codes
    assert packed.shape == (1, 1, 4, 16, 4) and packed.dtype == torch.uint8
    assert packed[0, 0, 1, 1, 1] == 0xF3 and int(packed.sum()) == 0xF3
    assert p.format == F.Q4_A8


@needs_kernel
@pytest.mark.parametrize("out", [37, 64])
def test_a8_4_bit_codes_give_the_8_bit_codes_products(out: int) -> None:
    """Q4_A8 (two codes a byte, sums from 0) and Q8_A8 (codes + 128 a byte, sums from -128
    times the sum of x's codes) give the same integers, so the same bits, on every kernel."""
    w = gguf_like(out, 3, 9)
    codes = affine.affine_codes(w)
    assert codes is not None
    nibbles = packing.pack_codes_a8(codes)
    assert nibbles.format == F.Q4_A8
    low, high = nibbles.codes & 15, nibbles.codes >> 4
    bytes_each = replace(nibbles, format=F.Q8_A8, codes=(torch.cat([low, high], dim=2)
                                                         .to(torch.int16) + 128).to(torch.uint8))
    x = torch.randn(40, 96, generator=torch.Generator().manual_seed(10))
    bias = torch.randn(out)
    for kernel in kernels():
        for rows in (1, 2, 3, 4, 5, 8, 9, 13, 40):
            got = product.product_on(kernel, x[:rows], nibbles, bias)
            want = product.product_on(kernel, x[:rows], bytes_each, bias)
            assert torch.equal(got, want), (kernel.isa_name, kernel.dot_name, rows)


@needs_kernel
@pytest.mark.parametrize(("form", "fmt"), [("q4_1", F.Q4_A8), ("q8_0", F.Q8_A8),
                                           ("q4_k", F.Q4_F32_A8), ("q5_k", F.Q8_F32_A8)])
@pytest.mark.parametrize("out", [37, 64])  # 64: up to 4 rows go in pairs of blocks
def test_a8_products_round_each_row_on_its_own(form: str, fmt: ffi.WeightFormat, out: int) -> None:
    """Quantization "a8": the product of the codes with x rounded to 8-bit blocks; bit for bit
    the same on every instruction set (integer sums) and for a row alone or among others.
    K-quant codes (float32 d and m, Q4_F32_A8 and Q8_F32_A8) included."""
    g = torch.Generator().manual_seed(5)
    weight: torch.Tensor | affine.AffineCodes
    if form in ("q4_k", "q5_k"):
        weight = k_quant_codes(out, 3, 6, form)
        w = materialized(weight)
    else:
        w = (
            gguf_like(out, 3, 6)
            if form == "q4_1"
            else round_to_q8_0(torch.randn(out, 96, generator=g))
        )
        weight = w
    bias = torch.randn(out, generator=g)
    linear = Linear(weight, bias, "native", quantization="a8")
    packed = linear.packed
    assert packed is not None and packed.codes.dtype == torch.uint8 and packed.format == fmt
    x = torch.randn(40, 96, generator=g) * torch.logspace(-3, 1, 96)  # chunks of many sizes
    x[0, :32] = 0.0  # an all-zero chunk rounds to zeros
    expected = round_rows_like_the_kernel(x).double() @ w.double().T + bias.double()
    results = []
    for kernel in kernels():
        alone = [product.product_on(kernel, x[i : i + 1], packed, bias)[0] for i in range(40)]
        for rows in (2, 3, 4, 5, 8, 9, 13, 16, 40):  # tiles of 8, 4 and 1-3 rows
            whole = product.product_on(kernel, x[:rows], packed, bias)
            torch.testing.assert_close(whole.double(), expected[:rows], atol=5e-5, rtol=0)
            for i in range(rows):
                assert torch.equal(alone[i], whole[i]), (kernel.isa_name, rows, i)
        results.append(torch.stack(alone))
    assert all(torch.equal(r, results[0]) for r in results[1:])
    plain = x.double() @ w.double().T + bias.double()
    assert (results[0].double() - plain).abs().max() > 1e-3  # the rounding is real


@needs_kernel
@pytest.mark.parametrize("form", ["q4_1", "q8_0"])
@pytest.mark.parametrize("out", [37, 64])
def test_a8_float32_scales_give_the_float16_scales_products(form: str, out: int) -> None:
    """Q4_F32_A8 and Q8_F32_A8 (float32 d and m, for K-quants) run Q4_A8's and Q8_A8's
    operations: the same d and m stored either way give the same bits on every kernel and row
    count."""
    g = torch.Generator().manual_seed(out)
    w = gguf_like(out, 3, 7) if form == "q4_1" else round_to_q8_0(torch.randn(out, 96, generator=g))
    codes = affine.affine_codes(w)
    assert codes is not None
    half = packing.pack_codes_a8(codes)
    assert half.format == (F.Q4_A8 if form == "q4_1" else F.Q8_A8) and half.scales is not None
    full = replace(half, format=F.Q4_F32_A8 if form == "q4_1" else F.Q8_F32_A8,
                   scales=half.scales.float())  # fmt: skip
    x = torch.randn(40, 96, generator=g)
    bias = torch.randn(out, generator=g)
    for kernel in kernels():
        for rows in (1, 2, 3, 4, 5, 8, 9, 13, 40):
            got = product.product_on(kernel, x[:rows], full, bias)
            want = product.product_on(kernel, x[:rows], half, bias)
            assert torch.equal(got, want), (kernel.isa_name, kernel.dot_name, rows)


@needs_kernel
def test_a8_needs_weights_stored_as_codes() -> None:
    w = torch.randn(32, 64)
    with pytest.raises(ValueError, match=r"no weight of this model is stored as codes.*w8a8"):
        pack_together([Linear(w, None, "auto", quantization="a8")])
    with pytest.raises(ValueError, match=r"native kernel only.*'torch'"):
        Linear(gguf_like(32, 2, 1), None, "torch", quantization="a8")
    coded = Linear(w, None, "auto", quantization="w8a8")  # rounded to q8_0 first
    pack_together([coded])
    assert coded.packed is not None and coded.packed.format == F.Q8_A8
    assert coded.packed.codes.dtype == torch.uint8


def k_quant_codes(rows: int, chunks: int, seed: int, form: str) -> affine.AffineCodes:
    """GGUF K-quant-style codes, whose d and m are products of float16 values and 6- or 8-bit
    scales (so mostly not float16 values): "q4_k" per 32 columns d = d16 * sc, m = -dmin16 * mn,
    q in 0..15; "q5_k" the same with q in 0..31; "q6_k" per 16 columns d = d16 * sc (sc signed
    8-bit), m = 0, q in -32..31; "mixed" per 16 columns both forms' d and m in turn (fused
    weights of both formats)."""
    g = torch.Generator().manual_seed(seed)
    group = 32 if form in ("q4_k", "q5_k") else 16
    shape = (rows, chunks * 32 // group)
    d16 = (torch.rand(rows, 1, generator=g) * 1e-3 + 1e-4).half().float()
    if group == 32:
        d = d16 * torch.randint(1, 64, shape, generator=g)
        m = -(d16 * 3).half().float() * torch.randint(0, 64, shape, generator=g)
        top = 16 if form == "q4_k" else 32
        q = torch.randint(0, top, (rows, chunks * 32), generator=g, dtype=torch.int8)
        return affine.AffineCodes(q, d, m)
    d = d16 * torch.randint(-128, 128, shape, generator=g)
    q = torch.randint(-32, 32, (rows, chunks * 32), generator=g, dtype=torch.int8)
    m = torch.zeros(shape)
    if form == "mixed":
        m = -(d16 * 3).half().float() * torch.randint(0, 64, shape, generator=g)
        m[: rows // 2] = 0  # the first rows Q6_K-like, the others Q4_K-like
    return affine.AffineCodes(q, d, m, group=group)


def materialized(codes: affine.AffineCodes) -> torch.Tensor:
    """W = d * q + m in float32, as the dequantizer computes it."""
    d = codes.d.repeat_interleave(codes.group, 1)
    m = codes.m.repeat_interleave(codes.group, 1)
    return torch.addcmul(m, d, codes.codes.float())


def test_k_quant_layouts() -> None:
    """Q4_F32_DM: Q4_F16_DM's codes with float32 d and m; Q8_F32_DM_HALVES: Q8_F32_DM's codes with d
    and m each 16 columns at [b, c, h, 0 or 1, j]; Q8_F32_D_HALVES: Q8_F32_DM_HALVES's d alone. a8
    refuses both; under a8 Q4_K codes are Q4_A8's layout with float32 d and m (Q4_F32_A8)."""
    codes = k_quant_codes(37, 3, 1, "q4_k")
    p = packing.pack_codes(codes)
    packed, scales = p.codes, p.scales
    assert scales is not None and p.format == F.Q4_F32_DM
    assert packed.shape == (3, 3, 4, 16, 4) and packed.dtype == torch.int8
    assert scales.shape == (3, 3, 2, 16) and scales.dtype == torch.float32
    assert scales[1, 2, 0, 3] == codes.d[19, 2] and scales[1, 2, 1, 3] == codes.m[19, 2]
    assert (packed.numel() + 4 * scales.numel()) / (48 * 96) == 0.75  # bytes a weight
    for form, fmt, dm in (("mixed", F.Q8_F32_DM_HALVES, 2), ("q6_k", F.Q8_F32_D_HALVES, 1)):
        codes = k_quant_codes(37, 3, 2, form)
        p = packing.pack_codes(codes)
        packed, scales = p.codes, p.scales
        assert scales is not None and p.format == fmt
        assert packed.shape == (3, 3, 16, 32) and scales.shape == (3, 3, 2, dm, 16)
        assert torch.equal(packed[1, 2, 3], codes.codes[19, 64:96])
        assert scales[1, 2, 1, 0, 3] == codes.d[19, 5]  # columns 80 .. 95: group 5
        if fmt == F.Q8_F32_DM_HALVES:
            assert scales[1, 2, 0, 1, 3] == codes.m[19, 4] != 0
        assert p.bytes / (48 * 96) == (1.5 if fmt == F.Q8_F32_DM_HALVES else 1.25)
        with pytest.raises(ValueError, match="one d and m per 32 columns"):
            packing.pack_codes_a8(codes)
    codes = k_quant_codes(37, 3, 1, "q4_k")
    p = packing.pack_codes_a8(codes)
    packed, scales = p.codes, p.scales
    assert scales is not None and p.format == F.Q4_F32_A8
    assert packed.shape == (3, 3, 4, 16, 4) and scales.shape == (3, 3, 2, 16)
    assert scales.dtype == torch.float32 and scales[1, 2, 1, 3] == codes.m[19, 2]
    assert (packed.numel() + 4 * scales.numel()) / (48 * 96) == 0.75  # bytes a weight


ROW_COUNTS = (1, 2, 3, 4, 5, 8, 9, 16, 40)  # 40: prefill-sized calls unpack each block once


def assert_products(packed: PackedWeight, twin: PackedWeight, w: torch.Tensor, exact: bool) -> None:
    """The products of packed near x W^T (+ b) in float32 on every instruction set, row count,
    with and without bias, rows bitwise lone rows; bitwise those of twin where exact."""
    out = packed.out_features
    g = torch.Generator().manual_seed(out)
    x = torch.randn(40, w.shape[1], generator=g)
    bias = torch.randn(out, generator=g)
    for kernel, b in itertools.product(kernels(), (bias, None)):
        alone = product.product_on(kernel, x[:1], packed, b)[0]
        for rows in ROW_COUNTS:
            got = product.product_on(kernel, x[:rows], packed, b)
            reference = x[:rows] @ w.T + (0 if b is None else b)
            scale = (x[:rows].abs() @ w.abs().T).amax()
            torch.testing.assert_close(got, reference, atol=float(scale) * 2e-6, rtol=0)
            assert torch.equal(got[0], alone), (kernel.isa_name, rows)
            want = product.product_on(kernel, x[:rows], twin, b)
            if exact:
                assert torch.equal(got, want), (kernel.isa_name, rows)


@needs_kernel
@pytest.mark.parametrize("out", [37, 64, 200])
def test_kind_7_gives_kind_2s_products(out: int) -> None:
    """Q4_K-like codes two a byte with float32 d and m (Q4_F32_DM) give, bit for bit, the products
    of the same codes a byte each (Q8_F32_DM)."""
    codes = k_quant_codes(out, 4, out, "q4_k")
    packed = packing.pack_codes(codes)
    assert packed.format == F.Q4_F32_DM and packed.scales is not None
    bytes_each, full = packing._codes_and_scales(codes)
    assert torch.equal(full, packed.scales)
    twin = replace(packed, format=F.Q8_F32_DM, codes=bytes_each, scales=full)  # Q8_F32_DM
    assert_products(packed, twin, materialized(codes), exact=True)


@needs_kernel
@pytest.mark.parametrize("out", [37, 64, 200])
@pytest.mark.parametrize("form", ["mixed", "q6_k"])
def test_16_column_scales_match_float32(form: str, out: int) -> None:
    """d and m each 16 columns (Q8_F32_DM_HALVES; Q8_F32_D_HALVES with d alone): products near the
    float32 ones of the dequantized weight; Q8_F32_D_HALVES's bitwise Q8_F32_DM_HALVES's with its m
    stored as zeros."""
    codes = k_quant_codes(out, 4, out, form)
    packed = packing.pack_codes(codes)
    scales = packed.scales
    assert scales is not None
    d_alone = packed.format == F.Q8_F32_D_HALVES
    assert packed.format == (F.Q8_F32_DM_HALVES if form == "mixed" else F.Q8_F32_D_HALVES)
    with_m = replace(packed, format=F.Q8_F32_DM_HALVES,
                     scales=torch.cat([scales, torch.zeros_like(scales)], dim=3)
                     ) if d_alone else packed  # fmt: skip
    assert_products(packed, with_m, materialized(codes), exact=d_alone)


@needs_kernel
@pytest.mark.parametrize("form", ["q4_k", "q8_0"])
def test_16_column_scales_repeated_give_kind_2s_products(form: str) -> None:
    """Where each chunk's two halves share d and m, Q8_F32_DM_HALVES (and, m being 0,
    Q8_F32_D_HALVES) gives Q8_F32_DM's bits."""
    g = torch.Generator().manual_seed(11)
    if form == "q4_k":
        codes = k_quant_codes(45, 4, 12, "q4_k")
    else:
        d = torch.rand(45, 4, generator=g) * 0.01 + 1e-3  # float32 d, m = 0
        q = torch.randint(-127, 128, (45, 128), generator=g, dtype=torch.int8)
        codes = affine.AffineCodes(q, d, torch.zeros(45, 4))
    bytes_each, full = packing._codes_and_scales(codes)
    halves = affine.AffineCodes(codes.codes, codes.d.repeat_interleave(2, 1),
                                 codes.m.repeat_interleave(2, 1), group=16)  # fmt: skip
    packed = packing.pack_codes(halves)
    assert packed.format == (F.Q8_F32_DM_HALVES if form == "q4_k" else F.Q8_F32_D_HALVES)
    twin = replace(packed, format=F.Q8_F32_DM, codes=bytes_each, scales=full)  # Q8_F32_DM
    assert_products(packed, twin, materialized(codes), exact=True)


def k_quantized(w: torch.Tensor, form: str) -> affine.AffineCodes:
    """w's values rounded to K-quant-style codes with float32 d and m: "q4_k" per 32 columns
    m = min, d = (max - min) / 15 (Q4_F32_DM); "q6_k" per 16 columns d = max |w| / 31, m = 0
    (Q8_F32_D_HALVES); "mixed" per 16 columns as q4_k's (Q8_F32_DM_HALVES)."""
    group = 32 if form == "q4_k" else 16
    chunks = w.view(w.shape[0], -1, group)
    if form == "q6_k":
        m = torch.zeros_like(chunks[..., :1])
        d = chunks.abs().amax(-1, keepdim=True) / 31
        lo, hi = -32, 31
    else:
        m = chunks.amin(-1, keepdim=True)
        d = (chunks.amax(-1, keepdim=True) - m) / 15
        lo, hi = 0, 15
    q = torch.round((chunks - m) / d).clamp(lo, hi).to(torch.int8).view_as(w)
    return affine.AffineCodes(q, d[..., 0], m[..., 0], group=group)


def unpacked(lin: Linear) -> torch.Tensor:
    """A native layer's float weight [out, in] from its packed blocks (`pack`'s inverse)."""
    packed = lin.packed.codes
    blocks, chunks = packed.shape[:2]
    whole = packed.float().permute(0, 2, 1, 3).reshape(blocks * 16, chunks * 16)
    return whole[: lin.out_features, : lin.in_features]


@needs_kernel
def test_decoder_stack_runs_k_quant_kinds(tmp_path: Path, tokenizer) -> None:
    """The native stack (layer.c) runs Q4_F32_DM, Q8_F32_DM_HALVES and Q8_F32_D_HALVES as the
    layers' own products do."""
    make_checkpoint(tmp_path, "qwen2", tokenizer, layer_scale=8.0)
    runners = []
    for native in (True, False):
        model = load_model(tmp_path, torch.float32, CPU, "native")
        for layer in model.layers:
            for lin, form in ((layer.qkv, "mixed"), (layer.o, "q4_k"), (layer.gate_up, "q6_k"),
                              (layer.down, "q4_k")):  # fmt: skip
                codes = k_quantized(unpacked(lin), form)
                lin.packed = packing.pack_codes(codes)
        assert {lin.packed.format for layer in model.layers
                for lin in (layer.qkv, layer.o, layer.gate_up)} == {
            F.Q4_F32_DM, F.Q8_F32_DM_HALVES, F.Q8_F32_D_HALVES}  # fmt: skip
        model.native = (NativeStack(model.layers, model.config, model.inv_freq, model.final_norm)
                        if native else None)  # fmt: skip
        runners.append(Runner(model))
    assert_runs_match(runners[0], runners[1], 1e-5)


def q4_k_super_codes(rows: int, supers: int, seed: int) -> affine.AffineCodes:
    """Q4_K-style codes with their SuperScales: d = d16 * sc, m = negmin * mn per 32 columns
    (sc, mn 6-bit; d16, negmin float16 per 256 columns), q in 0..15."""
    g = torch.Generator().manual_seed(seed)
    d16 = (torch.rand(rows, supers, generator=g) * 1e-3 + 1e-4).half()
    negmin = -(torch.rand(rows, supers, generator=g) * 1e-3).half()
    negmin[0, 0] = 0.0  # a zero dmin: m is -0.0 * mn = +0 or -0, as gguf's -(dmin * mn)
    sub_d = torch.randint(0, 64, (rows, supers * 8), generator=g, dtype=torch.uint8)
    sub_m = torch.randint(0, 64, (rows, supers * 8), generator=g, dtype=torch.uint8)
    d = d16.float().repeat_interleave(8, 1) * sub_d.float()
    m = negmin.float().repeat_interleave(8, 1) * sub_m.float()
    q = torch.randint(0, 16, (rows, supers * 256), generator=g, dtype=torch.int8)
    factors = affine.SuperScales(d16, negmin, sub_d, sub_m)
    return affine.AffineCodes(q, d, m, super_scales=factors)


def test_super_scales_layout_worked_example() -> None:
    """Q4_SUPER_DM's scales [N'/16, K/256, 320]: d16 and negmin of the block's 16 rows, then each
    chunk's sub_d and sub_m of the 16 rows (0.578 bytes a weight with the codes)."""
    codes = q4_k_super_codes(37, 2, 3)
    p = packing.pack_codes(codes)
    scales = p.scales
    assert p.format == F.Q4_SUPER_DM and scales is not None
    assert scales.shape == (3, 2, 320) and scales.dtype == torch.uint8
    f = codes.super_scales
    assert f is not None
    assert scales[1, 1, 2:4].view(torch.float16) == f.d16[17, 1]  # block 1, row 1
    assert scales[1, 1, 34:36].view(torch.float16) == f.negmin[17, 1]
    assert scales[1, 1, 64 + 32 + 1] == f.sub_d[17, 9]  # columns 288 .. 319: chunk 9
    assert scales[1, 1, 64 + 48 + 1] == f.sub_m[17, 9]
    assert scales[2, :, 64 + 5].tolist() == [0, 0]  # row 37: padding
    assert p.bytes / (48 * 512) == 0.578125  # bytes a weight


@needs_kernel
@pytest.mark.parametrize("out", [37, 64, 200])
def test_super_scales_give_the_float32_scales_products(out: int) -> None:
    """Q4_SUPER_DM and Q4_SUPER_A8 widen their stored factors into Q4_F32_DM's and Q4_F32_A8's
    float32 d and m, so they give those formats' products bit for bit, on every kernel and row
    count."""
    codes = q4_k_super_codes(out, 2, out)
    plain = affine.AffineCodes(codes.codes, codes.d, codes.m)  # without the factors
    for packer, formats in ((packing.pack_codes, (F.Q4_SUPER_DM, F.Q4_F32_DM)),
                            (packing.pack_codes_a8, (F.Q4_SUPER_A8, F.Q4_F32_A8))):  # fmt: skip
        stored, wide = packer(codes), packer(plain)
        assert (stored.format, wide.format) == formats
        assert torch.equal(stored.codes, wide.codes)
        x = torch.randn(40, 512, generator=torch.Generator().manual_seed(out))
        bias = torch.randn(out)
        for kernel in kernels():
            for rows in ROW_COUNTS:
                got = product.product_on(kernel, x[:rows], stored, bias)
                want = product.product_on(kernel, x[:rows], wide, bias)
                assert torch.equal(got, want), (formats, kernel.isa_name, rows)


def q6_k_super_codes(rows: int, supers: int, seed: int) -> affine.AffineCodes:
    """Q6_K-style codes with their Q6Scales: d = d16 * sc per 16 columns (sc int8, d16 float16
    per 256 columns, among them a subnormal, a huge one and -0.0), m = +0, q in -32..31."""
    g = torch.Generator().manual_seed(seed)
    d16 = ((torch.rand(rows, supers, generator=g) - 0.5) * 1e-2).half()
    d16[0, 0] = 2**-24  # float16's least subnormal
    d16[1 % rows, -1] = 60000.0
    d16[2 % rows, 0] = -0.0  # d = -0.0 * sc: +0 or -0, as blocks.c's d16 * sc
    sc = torch.randint(-128, 128, (rows, supers * 16), generator=g, dtype=torch.int8)
    d = d16.float().repeat_interleave(16, 1) * sc.float()
    q = torch.randint(-32, 32, (rows, supers * 256), generator=g, dtype=torch.int8)
    factors = affine.Q6Scales(d16, sc)
    return affine.AffineCodes(q, d, torch.zeros_like(d), group=16, super_scales=factors)


def test_q6_super_layout_worked_example() -> None:
    """Q6_SUPER_D: codes u = q + 32 in a plane of low nibbles and one of 2-bit fields [N'/16, K/32,
    384], scales [N'/16, K/256, 288]: d16 of the block's 16 rows, then sc of its 16 groups of
    16 columns for the 16 rows (0.8203 bytes a weight, as Q6_K stores it)."""
    codes = q6_k_super_codes(37, 2, 3)
    codes.codes[2, 5] = 0x2B - 32  # u = 0x2B: row 2, column 5 of block 0, chunk 0 (p = 69)
    codes.codes[16 + 9, 32 * 3 + 30] = 31 - 32  # u = 31: row 9 of block 1, column 30 of chunk 3
    p = packing.pack_codes(codes)
    packed, scales = p.codes, p.scales
    assert p.format == F.Q6_SUPER_D == 14 and scales is not None
    assert packed.shape == (3, 16, 384) and packed.dtype == torch.int8
    assert scales.shape == (3, 2, 288) and scales.dtype == torch.uint8
    b = packed.view(torch.uint8)
    assert b[0, 0, 5] >> 4 == 0xB and (b[0, 0, 256 + 5] >> 2) & 3 == 2
    # p = 32 * 9 + 30 = 318: vector k = 4 (low nibbles of bytes 128 ..), field 0 of plane 1
    assert b[1, 3, 128 + 62] & 15 == 15 and b[1, 3, 256 + 64 + 62] & 3 == 1
    f = codes.super_scales
    assert isinstance(f, affine.Q6Scales)
    assert scales[1, 1, 2:4].view(torch.float16) == f.d16[17, 1]  # block 1, row 1
    assert scales[1, 1, 32 + 16 * 1 + 1].view(torch.int8) == f.sc[17, 17]  # columns 272 .. 287
    assert scales[2, :, 32 + 5].tolist() == [0, 0]  # row 37 (block 2, row 5): padding, as
    assert not b[2, :, 96].any()  # are rows 37 and 39's column 0 (p = 160, 224) and 40 .. 47
    assert not b[2, :, 128:256].any() and not b[2, :, 256 + 64 :].any()
    assert p.bytes / (48 * 512) == 0.8203125  # bytes a weight
    assert 210 / 256 == 0.8203125  # a Q6_K block's bytes a weight


@needs_kernel
@pytest.mark.parametrize(("out", "supers"), [(37, 1), (64, 2), (200, 3), (16, 6)])
def test_q6_super_gives_kind_9s_products(out: int, supers: int) -> None:
    """Q6_SUPER_D unpacks its codes and widens its factors into Q8_F32_D_HALVES's codes and float32
    d, so it gives Q8_F32_D_HALVES's products bit for bit, on every kernel, row count, with and
    without bias."""
    codes = q6_k_super_codes(out, supers, out)
    plain = affine.AffineCodes(codes.codes, codes.d, codes.m, group=16)  # no factors
    stored, wide = packing.pack_codes(codes), packing.pack_codes(plain)
    assert (stored.format, wide.format) == (F.Q6_SUPER_D, F.Q8_F32_D_HALVES)
    assert_products(stored, wide, materialized(codes), exact=True)
    x = torch.randn(product.CHUNK_ROWS + 3, supers * 256)  # calls split in passes
    for kernel in kernels():
        got = product.product_on(kernel, x, stored, None)
        assert torch.equal(got, product.product_on(kernel, x, wide, None))


def test_q6_super_needs_its_factors_and_zero_m() -> None:
    """Only codes with Q6Scales, m +0 and whole 256-column blocks pack as Q6_SUPER_D; others keep
    Q8_F32_D_HALVES or Q8_F32_DM_HALVES, and a8 refuses them (d per 16 columns)."""
    codes = q6_k_super_codes(20, 1, 1)
    assert packing.q6_packable(codes)
    with_m = affine.AffineCodes(codes.codes, codes.d, codes.m.clone(), 16,
                                       codes.super_scales)  # fmt: skip
    with_m.m[3, 4] = -0.0
    assert not packing.q6_packable(with_m)
    assert packing.pack_codes(with_m).format == F.Q8_F32_DM_HALVES
    f = codes.super_scales
    assert isinstance(f, affine.Q6Scales)
    short = affine.Q6Scales(f.d16, f.sc[:, :8])  # 128 columns: no whole Q6_K block
    half = affine.AffineCodes(codes.codes[:, :128], codes.d[:, :8], codes.m[:, :8], 16,
                                     short)  # fmt: skip
    assert packing.pack_codes(half).format == F.Q8_F32_D_HALVES
    assert packing.a8_packable(codes)  # Q6_SUPER_A8
    for other in (with_m, half):
        assert not packing.a8_packable(other)
        with pytest.raises(ValueError, match="one d and m per 32 columns"):
            packing.pack_codes_a8(other)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 16, 37])
def test_native_q6_planes_give_torchs_bytes(rows: int, monkeypatch) -> None:
    """blocks.c's verispec_pack_q6 lays out codes as q6_planes' torch form does, for Q6_K's
    codes and for any byte (both keep u = q + 32's low 6 bits), rows padded with zero bytes."""
    g = torch.Generator().manual_seed(rows)
    six = torch.randint(-32, 32, (rows, 512), generator=g, dtype=torch.int8)
    every = torch.randint(-128, 128, (rows, 96), generator=g, dtype=torch.int8)
    native = [packing.q6_planes(six), packing.q6_planes(every)]
    monkeypatch.setattr(build, "native_kernel", lambda: build.NativeUnavailable(""))
    torch_made = [packing.q6_planes(six), packing.q6_planes(every)]
    for a, b in zip(native, torch_made, strict=True):
        assert a.shape == b.shape and torch.equal(a, b)


def test_each_packer_names_the_format_of_its_layout() -> None:
    """Every packer returns a PackedWeight whose format is the one verispec.h names for the
    layout it chose (test_build.py ties the header's names to ffi.WeightFormat): float weights
    F32 or F16, each GGUF form's codes under pack_codes and pack_codes_a8, Q4_K and Q6_K codes
    with their factors as stored; together they are every format, each once."""
    g = torch.Generator().manual_seed(12)
    q4_1 = affine.affine_codes(gguf_like(37, 3, 13))
    q8_0 = affine.affine_codes(round_to_q8_0(torch.randn(37, 96, generator=g)))
    assert q4_1 is not None and q8_0 is not None
    q5_1 = affine.AffineCodes(torch.randint(0, 32, (37, 96), generator=g, dtype=torch.int8),
                               torch.full((37, 3), 0.25), torch.full((37, 3), -0.5))  # fmt: skip
    q4_k, q5_k = k_quant_codes(37, 3, 14, "q4_k"), k_quant_codes(37, 3, 14, "q5_k")
    q4_k_super, q6_k_super = q4_k_super_codes(37, 1, 15), q6_k_super_codes(37, 1, 15)
    packed = [
        (pack(torch.randn(37, 40, generator=g), torch.float32), F.F32),
        (pack(torch.randn(37, 40, generator=g).half().float(), torch.float16), F.F16),
        (packing.pack_codes(q5_1), F.Q8_F32_DM),  # float16 d and m, 8-bit codes
        (packing.pack_codes(q5_k), F.Q8_F32_DM),  # float32 d and m
        (packing.pack_codes_a8(q8_0), F.Q8_A8),
        (packing.pack_codes(q4_1), F.Q4_F16_DM),
        (packing.pack_codes(q8_0), F.Q8_F16_D),
        (packing.pack_codes_a8(q4_1), F.Q4_A8),
        (packing.pack_codes(q4_k), F.Q4_F32_DM),
        (packing.pack_codes(k_quant_codes(37, 3, 14, "mixed")), F.Q8_F32_DM_HALVES),
        (packing.pack_codes(k_quant_codes(37, 3, 14, "q6_k")), F.Q8_F32_D_HALVES),
        (packing.pack_codes_a8(q4_k), F.Q4_F32_A8),
        (packing.pack_codes_a8(q5_k), F.Q8_F32_A8),
        (packing.pack_codes(q4_k_super), F.Q4_SUPER_DM),
        (packing.pack_codes_a8(q4_k_super), F.Q4_SUPER_A8),
        (packing.pack_codes(q6_k_super), F.Q6_SUPER_D),
        (packing.pack_q6(q6_k_super), F.Q6_SUPER_D),
        (packing.pack_codes_a8(q6_k_super), F.Q6_SUPER_A8),
    ]
    for p, fmt in packed:
        assert isinstance(p.format, ffi.WeightFormat) and p.format == fmt, (p.format, fmt)
        assert (p.scales is None) == (fmt in (F.F32, F.F16)), fmt
        assert p.out_features == 37 and p.codes.shape[0] == 3, fmt  # rows padded to 48
        # float weights' columns padded to 16; codes' in_features are their padded columns
        assert p.columns == (48 if p.scales is None else p.in_features), fmt
    assert {fmt for _, fmt in packed} == set(F)


def test_q6_a8_layout_worked_example() -> None:
    """Q6_SUPER_A8: Q6_SUPER_D's planes and scales, each chunk's codes in Q8_A8's
    order, so that position 64 k + 4 j + e (row j, column 4 k + e) is where Q6_SUPER_D keeps row
    (64 k + 4 j + e) // 32, column (64 k + 4 j + e) % 32."""
    codes = q6_k_super_codes(37, 2, 3)
    codes.codes[1, 5] = 0x2B - 32  # row 1, column 5 = 4 * 1 + 1: position 64 + 4 + 1 = 69
    p = packing.pack_codes_a8(codes)
    assert p.format == F.Q6_SUPER_A8 == 15 and p.scales is not None
    b = p.codes.view(torch.uint8)
    # where Q6_SUPER_D keeps row 2, column 5 (position 69: its own worked example)
    assert b[0, 0, 5] >> 4 == 0xB and (b[0, 0, 256 + 5] >> 2) & 3 == 2
    assert torch.equal(p.scales, packing.pack_q6(codes).scales)
    assert p.codes.shape == (3, 16, 384) and p.bytes / (48 * 512) == 0.8203125


@needs_kernel
@pytest.mark.parametrize(("out", "supers"), [(37, 1), (64, 2), (200, 3)])
def test_q6_a8_products_round_each_row_on_its_own(out: int, supers: int) -> None:
    """Q6_SUPER_A8: Q6_K codes times x rounded to 8-bit blocks, near that product in float64;
    bit for bit the same on every instruction set (VNNI or the portable loop: the same
    integers, then the same fmas) and for a row alone or among others."""
    codes = q6_k_super_codes(out, supers, out)
    f = codes.super_scales
    assert isinstance(f, affine.Q6Scales)
    f.d16[1 % out, -1] = 0.01  # not 60000: the products stay near their float64 values
    d = f.d16.float().repeat_interleave(16, 1) * f.sc.float()
    codes = affine.AffineCodes(codes.codes, d, codes.m, 16, f)
    packed = packing.pack_codes_a8(codes)
    assert packed.format == F.Q6_SUPER_A8
    g = torch.Generator().manual_seed(out)
    x = torch.randn(40, supers * 256, generator=g) * torch.logspace(-3, 1, supers * 256)
    x[0, :32] = 0.0  # an all-zero chunk rounds to zeros
    bias = torch.randn(out, generator=g)
    w = materialized(codes)
    expected = round_rows_like_the_kernel(x).double() @ w.double().T + bias.double()
    scale = round_rows_like_the_kernel(x).double().abs() @ w.double().abs().T
    results = []
    for kernel in kernels():
        whole = product.product_on(kernel, x, packed, bias)
        assert ((whole.double() - expected).abs() <= 1e-5 * scale + 1e-5).all(), kernel.isa_name
        for rows in ROW_COUNTS:
            alone = product.product_on(kernel, x[:rows], packed, bias)
            assert torch.equal(alone, whole[:rows]), (kernel.isa_name, rows)
        results.append(whole)
    assert all(torch.equal(r, results[0]) for r in results)
