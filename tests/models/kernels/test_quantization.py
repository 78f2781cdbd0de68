"""Weight-only quantization: the rounding itself (worked examples), and that a quantized model
computes exactly the model with those rounded weights (transformers as the reference)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close
from transformers import PreTrainedModel

from tests.helpers.checkpoints import make_checkpoint
from tests.helpers.harness import Runner, hf_logits, random_ids
from verispec import LLM
from verispec.models.kernels import build
from verispec.models.kernels.affine import affine_codes, dequantize_codes
from verispec.models.kernels.build import NativeKernel, NativeUnavailable, native_kernel
from verispec.models.kernels.ffi import WeightFormat
from verispec.models.kernels.linear import Linear
from verispec.models.kernels.quantization import (
    draft_quantization,
    int8_per_channel,
    round_to_fp16,
    round_to_q4_1,
    round_to_q8_0,
)
from verispec.models.weights.loader import load_model

CPU = torch.device("cpu")


def test_int8_worked_example() -> None:
    q, scale = int8_per_channel(torch.tensor([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0]]))
    assert q.dtype == torch.int8
    assert q.tolist() == [[64, -127, 32], [0, 0, 0]]  # 63.5 rounds to even
    assert_close(scale, torch.tensor([1 / 127, 1.0]))


def test_int8_error_is_at_most_half_a_step() -> None:
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    q, scale = int8_per_channel(w)
    assert int(q.abs().max()) == 127
    err = (q.float() * scale[:, None] - w).abs()
    assert bool((err <= scale[:, None] / 2 + 1e-7).all())


def test_fp16_rounding_worked_example() -> None:
    out = round_to_fp16(torch.tensor([0.1, 0.5]))
    assert out.dtype == torch.float32
    assert out.tolist() == [0.0999755859375, 0.5]


def test_q8_0_worked_example() -> None:
    out = round_to_q8_0(torch.tensor([[0.5, -1.0, 0.25] + [0.0] * 29]))
    assert out.dtype == torch.float32
    assert out[0, :4].tolist() == [0.50390625, -0.99993896484375, 0.251953125, 0.0]


def test_q8_0_is_gguf_q8_0_per_block_of_32() -> None:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(5, 70, generator=g) * torch.logspace(-6, 2, 70)  # scales vary per block
    out = round_to_q8_0(w)
    for block in range(0, 70, 32):
        part, got = w[:, block : block + 32], out[:, block : block + 32]
        d = (part.abs().amax(1, keepdim=True) / 127).half().float()  # [5, 1]
        assert torch.equal(got / d, torch.round(part / d).clamp(-127, 127))
        assert bool(((got - part).abs() <= d / 2 * 1.01).all())  # d rounds to float16
    assert torch.equal(round_to_q8_0(torch.zeros(2, 32)), torch.zeros(2, 32))


@pytest.mark.skipif(not isinstance(native_kernel(), NativeKernel), reason="no native kernel here")
def test_q8_0_weights_stream_as_8_bit_codes_on_the_native_kernel() -> None:
    w = torch.randn(48, 96, generator=torch.Generator().manual_seed(2))
    assert affine_codes(w) is None and affine_codes(round_to_q8_0(w)) is not None
    linear = Linear(w, None, "native", quantization="q8_0")
    packed = linear.packed  # 8-bit codes and float16 d: 1.0625 bytes a value instead of 4
    assert packed is not None and packed.format == WeightFormat.Q8_F16_D
    assert packed.codes.dtype == torch.int8
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(3))
    assert_close(linear(x).double(), x.double() @ round_to_q8_0(w).double().T, atol=2e-5, rtol=0)


def test_q4_1_worked_example() -> None:
    w = torch.zeros(1, 32)
    w[0, :4] = torch.tensor([0.0, 1.5, 3.0, 0.75])
    codes = round_to_q4_1(w)
    assert codes.codes[0, :5].tolist() == [0, 8, 15, 4, 0]
    assert codes.d.item() == 0.199951171875 and codes.m.item() == 0.0
    with pytest.raises(ValueError, match="blocks of 32 columns; this weight has 40"):
        round_to_q4_1(torch.zeros(2, 40))


def test_q4_1_error_is_at_most_half_a_step() -> None:
    """Every value within half its block's d (plus float16's rounding of m) of the weight, and
    the codes in 0..15 with float16 d and m, as GGUF's Q4_1 stores them."""
    w = torch.randn(8, 128, generator=torch.Generator().manual_seed(4))
    w[0, :32] = 0.5  # a constant block: d 0, every code 0, exact
    codes = round_to_q4_1(w)
    assert codes.four_bit and torch.equal(codes.d.half().float(), codes.d)
    assert torch.equal(codes.m.half().float(), codes.m)
    d = codes.d.repeat_interleave(32, 1)
    values = codes.codes.float() * d + codes.m.repeat_interleave(32, 1)
    slack = codes.m.abs().repeat_interleave(32, 1) * 2**-10
    assert ((values - w).abs() <= d / 2 + slack + 1e-6).all()
    assert torch.equal(values[0, :32], w[0, :32])


def test_q4_1_from_a_files_codes_equals_it_from_their_values() -> None:
    """A GGUF weight's codes are rounded a few rows at a time, never dequantized whole: the
    same codes, d and m as rounding the dequantized weight."""
    codes = affine_codes(round_to_q8_0(torch.randn(40, 96, generator=torch.Generator())))
    assert codes is not None
    direct, whole = round_to_q4_1(codes), round_to_q4_1(dequantize_codes(codes))
    assert torch.equal(direct.codes, whole.codes) and torch.equal(direct.d, whole.d)
    assert torch.equal(direct.m, whole.m)


@pytest.mark.skipif(not isinstance(native_kernel(), NativeKernel), reason="no native kernel")
def test_w4a8_weights_stream_as_4_bit_codes_times_8_bit_inputs() -> None:
    """quantization "w4a8": the weight rounded to Q4_1's codes (two a byte, float16 d and m) and
    multiplied by inputs rounded to 8-bit blocks: near x times the rounded weight."""
    w = torch.randn(40, 96, generator=torch.Generator().manual_seed(5))
    linear = Linear(w, None, "auto", quantization="w4a8")
    packed = linear.packed
    assert packed is not None and packed.format == WeightFormat.Q4_A8
    codes = round_to_q4_1(w)
    rounded = codes.codes.float() * codes.d.repeat_interleave(32, 1) + codes.m.repeat_interleave(
        32, 1)
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(6))
    blocks = x.view(3, -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    x8 = (torch.round(blocks * (127 / amax)) * (amax / 127)).view_as(x)  # as linear.c rounds x
    assert_close(linear(x).double(), x8.double() @ rounded.double().T, atol=2e-5, rtol=0)


def test_auto_draft_quantization_is_w8a8_where_integer_products_run(monkeypatch) -> None:
    """SpecConfig.quantization "auto": w8a8 for a float32 CPU draft whose native kernel runs
    the 8-bit products in integers (AVX-512 VNNI, AVX-VNNI, AVX2), else as stored (None: the
    portable scalar loop); explicit choices pass through unchanged."""
    f32 = torch.float32
    assert draft_quantization("q8_0", "torch", CPU, f32, False) == "q8_0"
    assert draft_quantization(None, "auto", CPU, f32, False) is None
    for isa, dot, expected in ((2, 3, "w8a8"), (1, 2, "w8a8"), (1, 1, "w8a8"), (0, 0, None)):
        monkeypatch.setattr(build, "native_kernel", lambda i=isa, d=dot: NativeKernel(None, i, d))
        assert draft_quantization("auto", "auto", CPU, f32, False) == expected
        assert draft_quantization("auto", "native", CPU, f32, False) == expected
        rounding = draft_quantization("auto", "auto", CPU, f32, False, "w4a8")  # the entry's
        assert rounding == ("w4a8" if expected else None)
    assert draft_quantization("auto", "torch", CPU, f32, False) is None  # the torch backend
    assert draft_quantization("auto", "auto", CPU, torch.float16, False) is None
    assert draft_quantization("auto", "auto", torch.device("meta"), f32, False) is None
    assert draft_quantization("auto", "auto", CPU, f32, True) is None  # compiled
    monkeypatch.setattr(build, "native_kernel", lambda: NativeUnavailable("no compiler"))
    assert draft_quantization("auto", "auto", CPU, f32, False) is None


def test_the_kernels_vnni_flag_matches_the_cpu() -> None:
    """NativeKernel.vnni: the 8-bit products run on vpdpbusd exactly where the CPU (Linux's
    /proc/cpuinfo) has AVX-512 F, BW and VNNI and VERISPEC_ISA leaves AVX-512 on."""
    kernel = native_kernel()
    info = Path("/proc/cpuinfo")
    if not isinstance(kernel, NativeKernel) or not info.is_file():
        pytest.skip("needs the native kernel and /proc/cpuinfo")
    flags = set(next(line for line in info.read_text().splitlines()
                     if line.startswith("flags")).split())  # fmt: skip
    allowed = build.isa_cap() == build.ISA_NAMES["avx512"]
    assert kernel.vnni == ({"avx512f", "avx512bw", "avx512_vnni"} <= flags and allowed)


def needs_native(quantization: str) -> object:
    """A parameter that needs the native kernel (the 8-bit input rounding runs there only)."""
    usable = isinstance(native_kernel(), NativeKernel)
    skip = pytest.mark.skipif(not usable, reason="no native kernel")
    return pytest.param(quantization, marks=skip)


def rounded_like_verispec(model: PreTrainedModel, quantization: str) -> PreTrainedModel:
    """A copy of model whose linear layers (and LM head) hold the values verispec computes with."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for name, module in out.named_modules():
            if isinstance(module, torch.nn.Linear):
                w = module.weight
                if quantization == "fp16":
                    new = round_to_fp16(w)
                elif quantization in ("q8_0", "w8a8"):
                    new = round_to_q8_0(w)
                else:
                    q, scale = int8_per_channel(w)
                    new = q.float() * scale[:, None]
                if name == "lm_head" and out.config.tie_word_embeddings:
                    module.weight = torch.nn.Parameter(new.clone())  # the embedding stays as is
                else:
                    w.copy_(new)
                if quantization == "w8a8":
                    module.register_forward_pre_hook(lambda _, args: (rounded_inputs(args[0]),))
    return out


def rounded_inputs(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] with each 32-column chunk rounded as the native kernel rounds a product's
    input under "a8"/"w8a8": to d * q, d = max |x| / 127, q = round(x * 127 / max |x|)."""
    k = x.shape[-1]
    chunks = torch.nn.functional.pad(x, (0, -k % 32)).unflatten(-1, (-1, 32))
    amax = chunks.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    return (torch.round(chunks * inv) * (amax / 127)).flatten(-2)[..., :k]


@pytest.fixture(scope="module", params=["llama", "qwen2"])  # qwen2: biases stay unrounded
def fp32_checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory, tokenizer
) -> tuple[Path, PreTrainedModel]:
    """Full float32 values (neither backend nor test rounds them by accident), sharp layers."""
    path = tmp_path_factory.mktemp(f"{request.param}-fp32")
    return path, make_checkpoint(path, request.param, tokenizer, layer_scale=8.0)


@pytest.mark.parametrize("quantization", ["fp16", "int8", "q8_0", needs_native("w8a8")])
def test_quantized_model_is_the_rounded_model(
    fp32_checkpoint: tuple[Path, PreTrainedModel], quantization: str
) -> None:
    path, hf_model = fp32_checkpoint
    reference = rounded_like_verispec(hf_model, quantization)
    ids = random_ids(24, hf_model.config.vocab_size, seed=3)
    runner = Runner(load_model(path, torch.float32, CPU, quantization=quantization))
    seq = runner.sequence()
    got = runner.forward([seq.chunk(ids, num_logits=len(ids))])
    expected, unrounded = hf_logits(reference, ids), hf_logits(hf_model, ids)
    if quantization == "w8a8":
        # An input a float32 rounding away from a step of its 8-bit grid may round the other
        # way here than in the reference (measured: logits 0.0034 apart at most, most equal);
        # on average much nearer the reference than the unrounded model.
        assert_close(got, expected, atol=1e-2, rtol=0)
        near, far = (got - expected).abs().mean(), (got - unrounded).abs().mean()
        assert near * 10 < far, (near, far)
        return
    assert_close(got, expected, atol=1e-4, rtol=0)
    # and it is not the unrounded model: farther from it than twice the tolerance above
    assert (got - unrounded).abs().max() > 2e-4


def test_engine_options_are_checked(llama_checkpoint: Path) -> None:
    with pytest.raises(ValueError, match="quantization must be one of fp16, int8, q8_0"):
        LLM(model=str(llama_checkpoint), quantization="int4")
