"""GGUF blocks as affine codes: for every quantized type the native kernel computes, the codes
rebuild gguf's dequantization value for value, and the products over them equal a float64
reference built from that dequantization (1-16 rows, row counts no multiple of 16)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as GGML
from gguf.quants import dequantize

from verispec.models.kernels import affine, build, packing
from verispec.models.kernels import linear as linear_module
from verispec.models.kernels.affine import dequantize_codes
from verispec.models.kernels.backends import native_usable
from verispec.models.kernels.ffi import WeightFormat
from verispec.models.kernels.linear import Linear, pack_codes_by_rows
from verispec.models.weights import gguf_blocks
from verispec.models.weights.gguf_blocks import CODED_TYPES, block_codes, regrouped, stacked

needs_native = pytest.mark.skipif(not native_usable(), reason="the native kernel cannot run here")
ROWS, COLUMNS = 37, 512  # 37: no multiple of the kernel's 16-row blocks


def random_blocks(kind: GGML, rows: int, columns: int, seed: int = 0) -> np.ndarray:
    """Random blocks of kind [rows, bytes a row] whose float16 scales are modest and finite."""
    block, size = GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (rows, columns // block, size), dtype=np.uint8)
    scale_offsets = {GGML.Q4_K: (0, 2), GGML.Q5_K: (0, 2), GGML.Q6_K: (208,),
                     GGML.Q4_1: (0, 2), GGML.Q5_1: (0, 2)}.get(kind, (0,))  # fmt: skip
    for offset in scale_offsets:
        scales = rng.uniform(0.001, 0.02, data.shape[:2]) * rng.choice([-1, 1], data.shape[:2])
        data[:, :, offset : offset + 2] = (
            scales.astype(np.float16).view(np.uint8).reshape(*data.shape[:2], 2)
        )
    return data.reshape(rows, -1)


@pytest.mark.parametrize("kind", CODED_TYPES, ids=lambda k: k.name)
def test_codes_rebuild_ggufs_dequantization(kind: GGML) -> None:
    data = random_blocks(kind, ROWS, COLUMNS)
    codes = block_codes(data, kind, ROWS, COLUMNS)
    reference = torch.from_numpy(dequantize(data, kind).reshape(ROWS, COLUMNS))
    assert codes.codes.dtype == torch.int8 and codes.group == (16 if kind == GGML.Q6_K else 32)
    assert torch.equal(dequantize_codes(codes), reference)


def test_codes_of_every_byte_pattern_match_even_huge_scales() -> None:
    """Unsanitized random bytes (scales up to float16's range, subnormals): still equal."""
    for kind in CODED_TYPES:
        block, size = GGML_QUANT_SIZES[kind]
        data = np.random.default_rng(1).integers(0, 256, (5, 512 // block * size), np.uint8)
        with np.errstate(all="ignore"):
            reference = torch.from_numpy(dequantize(data, kind).reshape(5, 512))
            values = dequantize_codes(block_codes(data, kind, 5, 512))
        assert torch.equal(values.nan_to_num(), reference.nan_to_num()), kind.name


def test_the_module_example() -> None:
    """Q4_0, d = 0.5: nibbles 0, 15, 8 are -4.0, 3.5, 0.0; codes keep them with m = -8 d."""
    block = np.zeros((1, 18), dtype=np.uint8)
    block[0, :2] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)
    block[0, 2] = 0xF0  # value 0: low nibble 0; value 16: high nibble 15
    block[0, 3] = 0x08  # value 1: 8
    codes = block_codes(block, GGML.Q4_0, 1, 32)
    assert codes.codes[0, [0, 16, 1]].tolist() == [0, 15, 8]
    assert (float(codes.d[0, 0]), float(codes.m[0, 0])) == (0.5, -4.0)
    assert dequantize_codes(codes)[0, [0, 16, 1]].tolist() == [-4.0, 3.5, 0.0]


@needs_native
@pytest.mark.parametrize("kind", CODED_TYPES, ids=lambda k: k.name)
def test_products_over_codes_equal_a_float64_reference(kind: GGML) -> None:
    data = random_blocks(kind, ROWS, COLUMNS, seed=2)
    codes = block_codes(data, kind, ROWS, COLUMNS)
    weight = torch.from_numpy(dequantize(data, kind).reshape(ROWS, COLUMNS)).double()
    bias = torch.randn(ROWS, generator=torch.Generator().manual_seed(3))
    lin = Linear(codes, bias, "auto")
    assert lin.kernel == "native" and lin.packed is not None
    assert lin.packed.codes.dtype in (torch.int8, torch.uint8)
    for rows in (1, 2, 4, 5, 8, 9, 16):
        x = torch.randn(rows, COLUMNS, generator=torch.Generator().manual_seed(rows))
        y = lin(x)
        reference = x.double() @ weight.T + bias.double()
        scale = (x.double().abs() @ weight.abs().T).max()
        assert (y.double() - reference).abs().max() <= 1e-5 * scale, (kind.name, rows)
        assert torch.equal(y[:1], lin(x[:1])), "a verify row is the lone decode row's bits"


@needs_native
def test_packing_by_rows_equals_packing_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    for kind in (GGML.Q4_K, GGML.Q6_K, GGML.Q8_0, GGML.Q4_1):
        codes = block_codes(random_blocks(kind, 100, 256, seed=4), kind, 100, 256)
        monkeypatch.setattr(linear_module, "PACK_ROWS", 32)
        pieces = pack_codes_by_rows(codes)
        whole = packing.pack_codes(codes)
        assert pieces.format == whole.format, kind.name
        assert torch.equal(pieces.codes, whole.codes), kind.name
        assert pieces.scales is not None and whole.scales is not None
        assert torch.equal(pieces.scales, whole.scales), kind.name
        assert (pieces.out_features, pieces.in_features) == (whole.out_features,
                                                             whole.in_features)  # fmt: skip


def test_stacking_mixed_groups_keeps_every_value() -> None:
    """q and k in Q4_K, v in Q6_K: one qkv of codes with d and m per 16 columns."""
    parts = [block_codes(random_blocks(k, 16, 256, seed=i), k, 16, 256)
             for i, k in enumerate((GGML.Q4_K, GGML.Q4_K, GGML.Q6_K))]  # fmt: skip
    qkv = stacked(parts)
    assert qkv.group == 16 and qkv.codes.shape == (48, 256)
    assert torch.equal(dequantize_codes(qkv), torch.cat([dequantize_codes(p) for p in parts]))
    assert torch.equal(dequantize_codes(regrouped(parts[0], 16)), dequantize_codes(parts[0]))
    floats = stacked([parts[0], torch.ones(4, 256)])
    assert isinstance(floats, torch.Tensor) and floats.shape == (20, 256)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """a and b equal bit for bit, or both NaN (a NaN's payload is the hardware's choice)."""
    both_nan = a.isnan() & b.isnan()
    return torch.equal(a.view(torch.int32)[~both_nan], b.view(torch.int32)[~both_nan])


@needs_native
@pytest.mark.parametrize("kind", CODED_TYPES, ids=lambda k: k.name)
def test_native_decoding_gives_the_numpy_forms_bits(kind: GGML, monkeypatch) -> None:
    """blocks.c decodes every byte pattern (huge, subnormal, infinite and NaN float16 scales,
    signed zeros) to the codes, d and m of this module's numpy forms, bit for bit."""
    block, size = GGML_QUANT_SIZES[kind]
    data = np.random.default_rng(2).integers(0, 256, (41, 1024 // block * size), np.uint8)
    data[0, :size] = 0  # a zero block: d = +0, m = -0 for the K-quants' -(dmin mn)
    native = block_codes(data, kind, 41, 1024)
    monkeypatch.setattr(gguf_blocks, "native_kernel", lambda: build.NativeUnavailable(""))
    with np.errstate(all="ignore"):
        reference = block_codes(data, kind, 41, 1024)
    assert torch.equal(native.codes, reference.codes) and native.group == reference.group
    assert _same_bits(native.d, reference.d) and _same_bits(native.m, reference.m)


@needs_native
@pytest.mark.parametrize("rows", [1, 16, 37])
def test_native_packing_gives_torchs_bytes(rows: int, monkeypatch) -> None:
    """blocks.c's packing lays codes out as the torch reshapes do: a byte each, and two a byte
    (Q4_F16_DM and Q4_F32_DM), rows padded with zeros."""
    g = torch.Generator().manual_seed(rows)
    wide = torch.randint(-128, 128, (rows, 96), generator=g, dtype=torch.int8)
    narrow = torch.randint(0, 16, (rows, 96), generator=g, dtype=torch.int8)
    native = [packing.packed_code_bytes(wide, False),
              packing.packed_code_bytes(narrow, True)]  # fmt: skip
    monkeypatch.setattr(build, "native_kernel", lambda: build.NativeUnavailable(""))
    torch_made = [packing.packed_code_bytes(wide, False),
                  packing.packed_code_bytes(narrow, True)]  # fmt: skip
    for a, b in zip(native, torch_made, strict=True):
        assert a.shape == b.shape and torch.equal(a, b)


@needs_native
def test_q4_k_super_scales_multiply_out_to_d_and_m() -> None:
    """A Q4_K tensor's codes carry d's and m's factors as the file stores them, whose float32
    products are d and m bit for bit; stacking and row permutations keep them in step."""
    data = random_blocks(GGML.Q4_K, ROWS, COLUMNS, seed=3)
    codes = block_codes(data, GGML.Q4_K, ROWS, COLUMNS)
    f = codes.super_scales
    assert f is not None and f.d16.shape == (ROWS, COLUMNS // 256)
    for c in (codes, stacked([codes, codes]),
              gguf_blocks.permuted_rows(codes, torch.randperm(ROWS))):  # fmt: skip
        f = c.super_scales
        assert f is not None
        d = f.d16.float().repeat_interleave(8, 1) * f.sub_d.float()
        m = f.negmin.float().repeat_interleave(8, 1) * f.sub_m.float()
        assert torch.equal(d.view(torch.int32), c.d.view(torch.int32))
        assert torch.equal(m.view(torch.int32), c.m.view(torch.int32))
    assert gguf_blocks.regrouped(codes, 16).super_scales is None
    six = block_codes(random_blocks(GGML.Q6_K, ROWS, COLUMNS), GGML.Q6_K, ROWS, COLUMNS)
    assert stacked([codes, six]).super_scales is None  # q, k as Q4_K with v as Q6_K


@needs_native
def test_q6_k_factors_multiply_out_to_d() -> None:
    """A Q6_K tensor's codes carry d's factors as the file stores them (d16 * sc is d bit for
    bit), kept in step by stacking and row permutations, and pack as Q6_SUPER_D by
    default; stacked beside Q4_K parts they are dropped (Q8_F32_DM_HALVES)."""
    data = random_blocks(GGML.Q6_K, ROWS, COLUMNS, seed=5)
    codes = block_codes(data, GGML.Q6_K, ROWS, COLUMNS)
    f = codes.super_scales
    assert isinstance(f, affine.Q6Scales) and f.d16.shape == (ROWS, COLUMNS // 256)
    for c in (codes, stacked([codes, codes]),
              gguf_blocks.permuted_rows(codes, torch.randperm(ROWS))):  # fmt: skip
        f = c.super_scales
        assert isinstance(f, affine.Q6Scales)
        d = f.d16.float().repeat_interleave(16, 1) * f.sc.float()
        assert torch.equal(d.view(torch.int32), c.d.view(torch.int32))
        assert pack_codes_by_rows(c).format == WeightFormat.Q6_SUPER_D
    four = block_codes(random_blocks(GGML.Q4_K, ROWS, COLUMNS), GGML.Q4_K, ROWS, COLUMNS)
    qkv = stacked([four, four, codes])  # q, k as Q4_K with v as Q6_K
    assert qkv.super_scales is None
    assert pack_codes_by_rows(qkv).format == WeightFormat.Q8_F32_DM_HALVES
    lin = Linear(codes, None, "auto")
    assert lin.packed is not None and lin.packed.format == WeightFormat.Q6_SUPER_D
    assert linear_module.kernels_in_use([lin]) == {"6-bit codes, d as stored (Q6_K)":
                                                   f"native {build.loaded().isa_name}"}


@needs_native
def test_native_q6_k_factors_give_numpys_bytes() -> None:
    """blocks.c's verispec_q6_k_super reads every byte pattern (huge, subnormal, infinite and
    NaN float16 d, any sc) as numpy's slices of the blocks do, byte for byte."""
    block, size = GGML_QUANT_SIZES[GGML.Q6_K]
    data = np.random.default_rng(6).integers(0, 256, (41, 1024 // block * size), np.uint8)
    data[0, 208:210] = [0x00, 0x80]  # d16 = -0.0
    data[1, 208:210] = [0x01, 0x00]  # the least subnormal
    data[2, 208:210] = [0x01, 0x7C]  # a signalling NaN
    native = gguf_blocks.q6_k_factors(data, 41, 1024, build.loaded())
    reference = gguf_blocks.q6_k_factors(data, 41, 1024)
    assert torch.equal(native.d16.view(torch.int16), reference.d16.view(torch.int16))
    assert torch.equal(native.sc, reference.sc)
    assert reference.d16.view(torch.int16)[2, 0] == 0x7C01  # the bits as stored, never quieted
