"""portable.c, the products in plain C that any CPU with a C compiler runs (isa 0: an x86 CPU
without AVX2, every other machine): forced on this CPU against linear.c's instruction sets for
every weight format (8-bit-input formats bit for bit, float formats within float32 rounding), a
GGUF model on it with its weights packed as stored, and (opt-in, VERISPEC_CROSS=1) the same
products built for aarch64 and run under qemu-user."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.checkpoints import make_checkpoint
from tests.helpers.harness import Runner, random_ids
from tests.models.kernels.test_packing import (
    KERNEL,
    gguf_like,
    k_quant_codes,
    materialized,
    needs_kernel,
    q4_k_super_codes,
    q6_k_super_codes,
    round_rows_like_the_kernel,
)
from verispec import LLM, SamplingParams
from verispec.models.kernels import affine, build, packing, product
from verispec.models.kernels.build import NativeKernel
from verispec.models.kernels.ffi import WeightFormat
from verispec.models.kernels.linear import A8_FORMATS
from verispec.models.kernels.packing import PackedWeight, pack
from verispec.models.kernels.quantization import round_to_q8_0
from verispec.models.llama import LlamaModel
from verispec.models.weights.gguf import BlockEmbedding
from verispec.models.weights.loader import load_model

F = WeightFormat
CPU = torch.device("cpu")
OUT = 37  # weight rows: two blocks and a part one
ROWS = 17  # rows of x: every tile and remainder of every path


def weights(out: int) -> dict[WeightFormat, tuple[PackedWeight, torch.Tensor]]:
    """One packed weight of each format (out rows; 250 or 256 columns, 512 for the K-quants'
    super-blocks) with the float32 weight it holds."""
    g = torch.Generator().manual_seed(out)
    f32, f16 = torch.randn(out, 250, generator=g), torch.randn(out, 250, generator=g).half()
    q4_1 = affine.affine_codes(gguf_like(out, 8, 1))
    q8_0 = affine.affine_codes(round_to_q8_0(torch.randn(out, 256, generator=g)))
    assert q4_1 is not None and q8_0 is not None
    q5_1 = affine.AffineCodes(torch.randint(0, 32, (out, 256), generator=g, dtype=torch.int8),
                              torch.full((out, 8), 0.25), torch.full((out, 8), -0.5))  # fmt: skip
    q4_k, q5_k = k_quant_codes(out, 8, 2, "q4_k"), k_quant_codes(out, 8, 3, "q5_k")
    mixed, q6_k = k_quant_codes(out, 8, 4, "mixed"), k_quant_codes(out, 8, 5, "q6_k")
    q4_super, q6_super = q4_k_super_codes(out, 2, 6), q6_k_super_codes(out, 2, 7)
    factors = q6_super.super_scales
    assert isinstance(factors, affine.Q6Scales)
    factors.d16[1, -1] = 0.01  # not 60000: a8's products stay near their float64 values
    d = factors.d16.float().repeat_interleave(16, 1) * factors.sc.float()
    q6_super = affine.AffineCodes(q6_super.codes, d, q6_super.m, 16, factors)
    packed = [
        (pack(f32, torch.float32), f32), (pack(f16.float(), torch.float16), f16.float()),
        *[(packing.pack_codes(c), materialized(c))
          for c in (q5_1, q4_1, q8_0, q4_k, mixed, q6_k, q4_super, q6_super)],
        *[(packing.pack_codes_a8(c), materialized(c))
          for c in (q8_0, q4_1, q4_k, q5_k, q4_super, q6_super)],
    ]  # fmt: skip
    by_format = {p.format: (p, w) for p, w in packed}
    assert set(by_format) == set(F)
    return by_format


def inputs(columns: int) -> torch.Tensor:
    """ROWS rows of x with values of many sizes, an all-zero chunk, and a chunk whose 8-bit
    rounding meets ties (127 / max |x| = 1: halves round to even)."""
    g = torch.Generator().manual_seed(columns)
    x = torch.randn(ROWS, columns, generator=g) * torch.logspace(-2, 1, columns)
    x[0, :32] = 0.0
    x[1, :32] = torch.tensor([127.0, *[k + 0.5 for k in range(-15, 16)]])
    return x


def x86_kernels() -> list[NativeKernel]:
    """linear.c on each instruction set this CPU runs."""
    assert isinstance(KERNEL, NativeKernel)
    return [NativeKernel(KERNEL.lib, isa) for isa in range(1, KERNEL.isa + 1)]


PORTABLE = NativeKernel(KERNEL.lib, 0) if isinstance(KERNEL, NativeKernel) else None
WEIGHTS = weights(OUT)


@needs_kernel
@pytest.mark.parametrize("fmt", list(F), ids=lambda f: f.name)
def test_portable_products_equal_linear_cs(fmt: WeightFormat) -> None:
    """Every format on isa 0, 1-17 rows of x, 37 outputs, with and without bias: near x W^T
    in float64 (for a8, with x rounded to 8-bit blocks); 8-bit-input formats bit for bit
    linear.c's on every instruction set here (the same integers, then the same fmas), float
    formats within float32 rounding of them; every row bit for bit its one-row product."""
    packed, w = WEIGHTS[fmt]
    x = inputs(packed.columns)[:, : w.shape[1]]
    bias = torch.randn(OUT, generator=torch.Generator().manual_seed(1))
    a8 = fmt in A8_FORMATS
    rounded = round_rows_like_the_kernel(x) if a8 else x
    expected = rounded.double() @ w.double().T + bias.double()
    scale = rounded.double().abs() @ w.double().abs().T + 1
    for b in (bias, None):
        whole = product.product_on(PORTABLE, x, packed, b)
        assert ((whole.double() - expected + (bias.double() if b is None else 0)).abs()
                <= (1e-5 if a8 else 2e-6) * scale).all(), fmt  # fmt: skip
        for rows in range(1, ROWS + 1):
            got = product.product_on(PORTABLE, x[:rows], packed, b)
            assert torch.equal(got, whole[:rows]), (fmt, rows)
            for kernel in x86_kernels():
                want = product.product_on(kernel, x[:rows], packed, b)
                if a8:
                    assert torch.equal(got, want), (fmt, kernel.isa_name, rows)
                else:
                    torch.testing.assert_close(got.double(), want.double(), rtol=0,
                                               atol=float(scale.max()) * 2e-6)  # fmt: skip


@needs_kernel
def test_portable_float_kinds_give_each_others_bits_for_the_same_weights() -> None:
    """The float formats compute the same weights and add each output's products in one order
    whatever their layout: Q4_1 codes as Q4_F16_DM (two a byte, float16 d and m), Q4_F32_DM (float32
    d and m) and Q8_F32_DM (a byte each) give the same bits, and so does F32 holding their
    values as float32."""
    codes = affine.affine_codes(gguf_like(OUT, 8, 1))
    assert codes is not None
    nibbles = packing.pack_codes(codes)
    bytes_each, scales = packing._codes_and_scales(codes)
    twins = [PackedWeight(F.Q4_F32_DM, nibbles.codes, scales, OUT, 256),
             PackedWeight(F.Q8_F32_DM, bytes_each, scales, OUT, 256),
             pack(materialized(codes), torch.float32)]  # fmt: skip
    x = inputs(256)
    want = product.product_on(PORTABLE, x, nibbles, None)
    for twin in twins:
        assert torch.equal(product.product_on(PORTABLE, x, twin, None), want), twin.format


@contextmanager
def portable_kernel() -> Iterator[NativeKernel]:
    """The kernel as VERISPEC_ISA=portable loads it (what a CPU without AVX2 gets), forgotten
    afterwards."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VERISPEC_ISA", "portable")
        build.native_kernel.cache_clear()
        try:
            kernel = build.native_kernel()
            assert isinstance(kernel, NativeKernel)
            yield kernel
        finally:
            build.native_kernel.cache_clear()
    build.native_kernel.cache_clear()


@needs_kernel
def test_verispec_isa_portable_loads_isa_0_without_the_decoder_stack() -> None:
    with portable_kernel() as kernel:
        assert (kernel.isa, kernel.isa_name, kernel.vnni, kernel.stack) == (0, "portable", False,
                                                                           False)  # fmt: skip
    assert build.loaded().isa == KERNEL.isa and build.loaded().stack


def test_sources_by_machine() -> None:
    """x86-64 builds linear.c and layer.c with portable.c and blocks.c; other machines the last
    two alone (portable.c then stands in for linear.c's entry points)."""
    names = {m: [p.name for p in build.sources(m)] for m in ("x86_64", "AMD64", "aarch64")}
    assert names["x86_64"] == names["AMD64"] == ["linear.c", "layer.c", "blocks.c", "portable.c"]
    assert names["aarch64"] == ["portable.c", "blocks.c"]


GGUF_CASES = (("Q4_1", {}), ("Q4_K", {"hidden_size": 256, "intermediate_size": 512}),
              ("Q6_K", {"hidden_size": 256, "intermediate_size": 512}))  # fmt: skip
STORED = {"Q4_1": (F.Q4_F16_DM, F.Q4_A8), "Q4_K": (F.Q4_SUPER_DM, F.Q4_SUPER_A8),
          "Q6_K": (F.Q6_SUPER_D, F.Q6_SUPER_A8)}  # fmt: skip
"""The format of a file's layers and head, without and with a8: its blocks as stored."""


@pytest.fixture(scope="module", params=GGUF_CASES, ids=lambda c: c[0])
def gguf_file(request, tmp_path_factory, tokenizer, write_gguf) -> tuple[Path, str]:
    qtype, overrides = request.param
    root = tmp_path_factory.mktemp(f"portable-{qtype}")
    source = make_checkpoint(root / "hf", "llama", tokenizer, layer_scale=8.0, **overrides)
    write_gguf(root / "model.gguf", source, tokenizer, qtype)
    return root / "model.gguf", qtype


def logits_of(model: LlamaModel) -> torch.Tensor:
    """Prefill and decode logits of fixed tokens: [34, vocab]."""
    runner, vocab = Runner(model), model.config.vocab_size
    seq = runner.sequence()
    prefill = runner.forward([seq.chunk(random_ids(30, vocab, 3), num_logits=30)])
    steps = [runner.forward([seq.chunk(random_ids(1, vocab, 4 + i))]) for i in range(4)]
    return torch.cat([prefill, *steps])


def run_file(path: Path, qtype: str, a8: bool) -> tuple[torch.Tensor, list[list[int]], bool]:
    """Load the file on the current kernel, check that its weights stay as stored (the layers
    and head packed in the file's format, the embedding left as blocks: no float32 copy), and
    return its logits with its layers in torch (as on every machine without layer.c), the
    greedy tokens of LLM without and with prompt lookup drafting, and whether the model took
    the native decoder stack."""
    quantization = "a8" if a8 else None
    model = load_model(path, torch.float32, CPU, quantization=quantization)
    linears = [lin for la in model.layers for lin in (la.qkv, la.o, la.gate_up, la.down)]
    assert {lin.packed.format for lin in [*linears, model.lm_head]} == {STORED[qtype][a8]}
    assert all(lin.packed.codes.dtype in (torch.int8, torch.uint8) for lin in linears)
    assert isinstance(model.embed, BlockEmbedding)
    native = model.native is not None
    model.native = None
    logits = logits_of(model)
    prompt = random_ids(6, model.config.vocab_size, 9)
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    lookup = {"method": "ngram", "num_speculative_tokens": 3}
    tokens = [LLM(model=str(path), speculative=spec, quantization=quantization, max_model_len=64)
              .generate([prompt], greedy)[0].token_ids for spec in (None, lookup)]  # fmt: skip
    return logits, tokens, native


@needs_kernel
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("a8", [True, False], ids=["a8", "floats"])
def test_a_gguf_model_runs_on_the_portable_path_as_stored(
    gguf_file: tuple[Path, str], a8: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On isa 0 a GGUF model keeps its blocks as stored and runs its layers in torch around the
    portable products (no decoder stack, as on a machine other than x86-64). Under a8 its
    logits are linear.c's bit for bit (torch layers on both); with float inputs within float32
    rounding of them. Greedy tokens equal linear.c's with the native decoder stack, with and
    without prompt lookup."""
    monkeypatch.setenv("VERISPEC_NO_GGUF_CACHE", "1")  # nothing written into the user's cache
    path, qtype = gguf_file
    with portable_kernel():
        logits, tokens, native = run_file(path, qtype, a8)
        assert not native
    want_logits, want_tokens, native = run_file(path, qtype, a8)
    assert native == build.loaded().stack
    if a8:
        assert torch.equal(logits, want_logits)
    else:
        torch.testing.assert_close(logits, want_logits, atol=1e-4, rtol=0)
    assert tokens[0] == tokens[1] == want_tokens[0] == want_tokens[1]
    assert len(set(tokens[0])) > 1


CROSS_CC, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"
cross = pytest.mark.skipif(
    os.environ.get("VERISPEC_CROSS") != "1" or not (shutil.which(CROSS_CC) and shutil.which(QEMU)),
    reason="opt-in: VERISPEC_CROSS=1 with aarch64-linux-gnu-gcc and qemu-aarch64 on PATH "
    "(Debian: apt-get install gcc-aarch64-linux-gnu qemu-user)",
)
DRIVER = Path(__file__).with_name("native") / "portable_driver.c"


def write_case(path: Path, packed: PackedWeight, x: torch.Tensor, bias: torch.Tensor | None,
               threads: int) -> None:  # fmt: skip
    """One product for portable_driver.c (its header says the layout)."""
    codes = packed.codes.contiguous().numpy().tobytes()
    scales = b"" if packed.scales is None else packed.scales.contiguous().numpy().tobytes()
    x = torch.nn.functional.pad(x, (0, packed.columns - x.shape[1])).contiguous()
    header = [int(packed.format), x.shape[0], packed.out_features, packed.columns, threads,
              bias is not None, len(codes), len(scales)]  # fmt: skip
    parts = [np.array(header, dtype=np.int64).tobytes(), x.numpy().tobytes(), codes, scales]
    path.write_bytes(b"".join([*parts, b"" if bias is None else bias.numpy().tobytes()]))


@cross
@needs_kernel
def test_aarch64_build_gives_the_same_products(tmp_path: Path) -> None:
    """The library as built for aarch64 (build.sources: portable.c and blocks.c, with the
    build's own flags, warnings as errors), and a driver on the same sources, run under
    qemu-user: every format's products bit for bit those of isa 0 on this CPU (IEEE arithmetic,
    the same operations in the same order, nothing contracted), so those of linear.c for the
    8-bit-input formats."""
    sources = [str(p) for p in build.sources("aarch64")]
    warnings = ("-Wall", "-Wextra", "-Werror")
    library = subprocess.run([CROSS_CC, *build.FLAGS, *warnings, "-o", str(tmp_path / "lib.so"),
                              *sources, *build.LIBS], capture_output=True, text=True)  # fmt: skip
    assert library.returncode == 0, library.stderr
    driver = tmp_path / "driver"
    done = subprocess.run([CROSS_CC, "-O3", "-fopenmp", "-static", *warnings,
                           f"-I{build.NATIVE}", "-o", str(driver), str(DRIVER), *sources,
                           *build.LIBS], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    cases, args = [], []
    bias = torch.randn(OUT, generator=torch.Generator().manual_seed(2))
    for fmt, (packed, w) in WEIGHTS.items():
        x = inputs(packed.columns)[:, : w.shape[1]]
        for rows, b in ((1, bias), (5, None), (ROWS, bias)):
            i = len(cases)
            write_case(tmp_path / f"in{i}", packed, x[:rows], b, threads=2)
            cases.append((fmt, product.product_on(PORTABLE, x[:rows], packed, b)))
            args += [str(tmp_path / f"in{i}"), str(tmp_path / f"out{i}")]
    run = subprocess.run([QEMU, str(driver), *args], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.returncode, run.stderr)
    for i, (fmt, want) in enumerate(cases):
        got = torch.from_numpy(np.fromfile(tmp_path / f"out{i}", dtype=np.float32))
        assert torch.equal(got.view_as(want), want), fmt
