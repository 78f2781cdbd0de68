"""The native kernel's paths (build.NativeKernel.paths, VERISPEC_ISA): every 8-bit-input
product is bit for bit the scalar loop's on every instruction set and integer dot product the
CPU runs (AVX2's vpmaddubsw, AVX-VNNI, AVX-512 VNNI; those it lacks skip), for any number of
rows and odd shapes; a whole model's greedy tokens and logits under "a8" are the same on every
path, with speculation too; the environment variable caps the path and the settings name it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.helpers.checkpoints import make_checkpoint
from tests.helpers.harness import Runner, random_ids, run_shapes
from tests.models.kernels.test_packing import k_quant_codes, q4_k_super_codes, q6_k_super_codes
from verispec import LLM, SamplingParams
from verispec.models.kernels import affine, build, packing, product
from verispec.models.kernels.build import NativeKernel, native_kernel
from verispec.models.kernels.ffi import WeightFormat as F
from verispec.models.kernels.linear import A8_FORMATS, WEIGHT_FORMATS
from verispec.models.weights.loader import load_model

CPU = torch.device("cpu")
KERNEL = native_kernel()
needs_kernel = pytest.mark.skipif(
    not isinstance(KERNEL, NativeKernel),
    reason=f"the native kernel cannot run here: {getattr(KERNEL, 'reason', '')}",
)
OUT = 83  # weight rows: not a multiple of 16 or 32, so the last block and pair are partial
ROWS = 17  # rows of x: tiles of 8, 4 and 1-3, and every count up to 17 on its own


def codes_of(fmt: F) -> affine.AffineCodes:
    """Codes [OUT, 512] that pack_codes_a8 packs as fmt, each with the extreme codes the
    integer bounds are about (a8_avx2.h): 4-bit 15, 6-bit 63 (q 31), 8-bit -128 and 127."""
    g = torch.Generator().manual_seed(int(fmt))
    if fmt == F.Q4_SUPER_A8:
        codes = q4_k_super_codes(OUT, 2, 1)
    elif fmt == F.Q6_SUPER_A8:
        codes = q6_k_super_codes(OUT, 2, 1)
        codes.codes[:3] = 31  # u = 63 against codes of x at +-127
        codes.codes[3, :64] = -32
    elif fmt in (F.Q4_F32_A8, F.Q8_F32_A8):
        codes = k_quant_codes(OUT, 16, 2, "q4_k" if fmt == F.Q4_F32_A8 else "q5_k")
        if fmt == F.Q8_F32_A8:  # any 8-bit code, not only Q5_K's 0..31
            codes.codes[:] = torch.randint(-128, 128, codes.codes.shape, generator=g)
    else:  # Q8_A8 and Q4_A8: float16 d and m
        top = 16 if fmt == F.Q4_A8 else 128
        q = torch.randint(0 if top == 16 else -128, top, (OUT, 512), generator=g,
                          dtype=torch.int8)  # fmt: skip
        d = (torch.rand(OUT, 16, generator=g) * 0.05).half().float()
        m = (-torch.rand(OUT, 16, generator=g) * 0.4).half().float()
        codes = affine.AffineCodes(q, d, m)
    top = 15 if fmt in (F.Q4_A8, F.Q4_F32_A8, F.Q4_SUPER_A8) else 127
    if fmt != F.Q6_SUPER_A8:
        codes.codes[:3] = top
        codes.codes[3:5] = 0 if top == 15 else -128
    return codes


def inputs() -> torch.Tensor:
    """x [ROWS, 512]: chunks of many sizes, an all-zero chunk, chunks whose codes are all
    +127 or -127 (the largest integer sums), and one of ties (x * 127 / max |x| = k + 0.5,
    rounded to even)."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(ROWS, 512, generator=g) * torch.logspace(-3, 1, 512)
    x[0, :32] = 0.0
    x[1, :64] = 3.0
    x[2, 64:128] = -5.0
    x[3] = 1.0
    x[4, 32:64] = torch.cat([torch.tensor([127.0]), torch.arange(31) - 14.5])  # 127 / max = 1
    return x


def reference_and_paths() -> tuple[NativeKernel, list[NativeKernel]]:
    """The scalar loop (isa 0) and every other path this CPU runs."""
    assert isinstance(KERNEL, NativeKernel)
    paths = KERNEL.paths()
    assert paths[0].isa == 0 and paths[0].dot_name == "scalar"
    return paths[0], paths[1:]


def assert_bitwise_the_scalar_loop(kernel: NativeKernel, fmt: F) -> None:
    """kernel's products of codes_of(fmt) for 1..ROWS rows, with and without bias, equal the
    scalar loop's bit for bit."""
    codes = codes_of(fmt)
    packed = packing.pack_codes_a8(codes)
    assert packed.format == fmt and packed.out_features == OUT
    x = inputs()
    scalar = NativeKernel(kernel.lib, 0, 0)
    for bias in (torch.randn(OUT, generator=torch.Generator().manual_seed(3)), None):
        want = product.product_on(scalar, x, packed, bias)
        for rows in range(1, ROWS + 1):
            got = product.product_on(kernel, x[:rows], packed, bias)
            same = torch.equal(got.view(torch.int32), want[:rows].view(torch.int32))
            assert same, (kernel.isa_name, kernel.dot_name, fmt, rows)


@needs_kernel
@pytest.mark.parametrize("fmt", A8_FORMATS, ids=lambda f: f.name)
def test_every_path_gives_the_scalar_loops_bits(fmt: F) -> None:
    """Every 8-bit-input format on every path this CPU runs (AVX2 here; AVX-VNNI and AVX-512
    VNNI where the CPU has them, and AVX2 forced beside them): the scalar loop's bits."""
    _, paths = reference_and_paths()
    assert paths and all(p.dot_name != "scalar" for p in paths)
    for kernel in paths:
        assert_bitwise_the_scalar_loop(kernel, fmt)


@needs_kernel
@pytest.mark.parametrize("dot", ["maddubs", "avx-vnni", "vnni"])
def test_each_dot_product_gives_the_scalar_loops_bits(dot: str) -> None:
    """Each integer dot product by name, skipped with the reason where this CPU lacks it."""
    _, paths = reference_and_paths()
    chosen = [p for p in paths if p.dot_name == dot]
    flag = {"maddubs": "avx2", "avx-vnni": "avx_vnni", "vnni": "avx512_vnni"}[dot]
    if not chosen:
        pytest.skip(f"this CPU has no {flag} (its cpuinfo flag): the {dot} tiles cannot run here")
    for kernel in chosen:
        for fmt in A8_FORMATS:
            assert_bitwise_the_scalar_loop(kernel, fmt)


def test_paths_go_from_the_scalar_loop_to_the_kernels_own() -> None:
    """NativeKernel.paths on a CPU whose library reports AVX-VNNI at isa 1 and AVX-512 VNNI
    at isa 2 (a Zen 5, say), capped at each; the isa argument carries the dot product."""

    class Library:
        @staticmethod
        def verispec_linear_dot(isa: int) -> int:
            return (0, 2, 3)[isa]

    lib = Library()
    full = NativeKernel(lib, 2, 3)  # type: ignore[arg-type]
    assert [(p.isa_name, p.dot_name) for p in full.paths()] == [
        ("portable", "scalar"), ("avx2", "maddubs"), ("avx2", "avx-vnni"),
        ("avx512", "maddubs"), ("avx512", "avx-vnni"), ("avx512", "vnni")]  # fmt: skip
    assert [p.isa_arg for p in full.paths()] == [0, 1 | 4, 1 | 8, 2 | 4, 2 | 8, 2 | 12]
    assert full.vnni and not NativeKernel(lib, 1, 2).vnni  # type: ignore[arg-type]
    assert NativeKernel(lib, 1, 1).paths()[-1] == NativeKernel(lib, 1, 1)  # type: ignore[arg-type]


@pytest.fixture
def fresh_kernel(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """native_kernel() forgotten before and after, so VERISPEC_ISA set by the test is read."""
    native_kernel.cache_clear()
    yield monkeypatch
    monkeypatch.delenv("VERISPEC_ISA", raising=False)
    native_kernel.cache_clear()


@needs_kernel
def test_verispec_isa_caps_the_path(fresh_kernel: pytest.MonkeyPatch) -> None:
    assert isinstance(KERNEL, NativeKernel)
    cpu = KERNEL.lib.verispec_linear_isa()
    for name, cap in build.ISA_NAMES.items():
        fresh_kernel.setenv("VERISPEC_ISA", name)
        native_kernel.cache_clear()
        kernel = native_kernel()
        assert isinstance(kernel, NativeKernel) and kernel.isa == min(cpu, cap), name
        assert kernel.dot == KERNEL.lib.verispec_linear_dot(kernel.isa)
        assert (kernel.dot_name == "scalar") == (name == "portable")
    assert native_kernel().isa_name == ("avx512" if cpu == 2 else "avx2")


def test_an_unknown_verispec_isa_names_the_allowed_ones(fresh_kernel: pytest.MonkeyPatch) -> None:
    fresh_kernel.setenv("VERISPEC_ISA", "sse4")
    with pytest.raises(ValueError, match=r"VERISPEC_ISA must be one of portable, avx2, avx512; "
                                         r"got 'sse4'"):  # fmt: skip
        native_kernel()


MODEL_FORMATS = {"Q4_K": F.Q4_SUPER_A8, "Q6_K": F.Q6_SUPER_A8, "Q8_0": F.Q8_A8}
"""GGUF block types of the model test, and the a8 format each runs as."""


@pytest.fixture(scope="module", params=list(MODEL_FORMATS))
def gguf_model(request, tmp_path_factory: pytest.TempPathFactory, tokenizer,
               write_gguf) -> tuple[Path, F]:  # fmt: skip
    """A tiny llama GGUF file whose matrices are blocks of one type, and its a8 format."""
    root = tmp_path_factory.mktemp(f"isa-{request.param}")
    source = make_checkpoint(root / "hf", "llama", tokenizer, layer_scale=8.0, hidden_size=256,
                             intermediate_size=512)  # fmt: skip
    path = root / "model.gguf"
    write_gguf(path, source, tokenizer, request.param)
    return path, MODEL_FORMATS[request.param]


@needs_kernel
@pytest.mark.usefixtures("one_thread")
def test_a_models_a8_tokens_and_logits_are_the_same_on_every_path(
    gguf_model: tuple[Path, F], fresh_kernel: pytest.MonkeyPatch
) -> None:
    """Under quantization "a8": the logits of every kind of forward (harness.run_shapes) equal
    on every VERISPEC_ISA this CPU runs with the same layer code (the native stack; torch's on
    the portable path), and so do greedy tokens; greedy tokens with prompt lookup drafting equal
    plain ones on every path; the settings name the path."""
    path, fmt = gguf_model
    fresh_kernel.setenv("VERISPEC_NO_GGUF_CACHE", "1")  # no metadata of it in the user's cache
    assert isinstance(KERNEL, NativeKernel)
    names = [n for n, cap in build.ISA_NAMES.items() if cap <= KERNEL.isa]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    results = []
    for name in names:
        fresh_kernel.setenv("VERISPEC_ISA", name)
        native_kernel.cache_clear()
        model = load_model(path, torch.float32, CPU, quantization="a8")
        a8 = {v for f, v in model.kernels().items() if "8-bit inputs" in f}
        kernel = build.loaded()
        assert a8 == {f"native {kernel.isa_name} {kernel.dot_name}"}, (name, model.kernels())
        assert WEIGHT_FORMATS[fmt] in model.kernels()
        logits = run_shapes(Runner(model), model.config.vocab_size)  # prefill, decode, verify...
        prompt = random_ids(4, model.config.vocab_size, seed=4) * 3  # repeats: lookup drafts
        plain = LLM(model=str(path), quantization="a8", speculative=None, max_model_len=64)
        drafted = LLM(model=str(path), quantization="a8", max_model_len=64,
                      speculative={"method": "ngram", "num_speculative_tokens": 4})  # fmt: skip
        tokens = plain.generate([prompt], params)[0].token_ids
        assert drafted.generate([prompt], params)[0].token_ids == tokens, name
        results.append((logits, tokens, kernel.stack))
    assert len(results) >= 2  # the portable path and at least AVX2
    for logits, tokens, stack in results[1:]:
        # the portable path runs its layers in torch (no layer.c), whose float order is not
        # layer.c's: its products' bits are compared with the others' in test_portable.py,
        # with torch layers on both sides
        same_layers = [(other, t) for other, t, other_stack in results if other_stack == stack]
        assert all(torch.equal(a, b) for a, b in zip(logits, same_layers[0][0], strict=True))
        assert tokens == same_layers[0][1]
    assert len(set(results[0][1])) > 1  # the model is sharp enough to say something
