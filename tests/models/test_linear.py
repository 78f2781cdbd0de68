"""Linear kernels: which one each weight gets, and that every one computes x W^T + b exactly
enough (float64 reference) without rounding a weight it was not asked to round."""

from __future__ import annotations

import pytest
import torch

from verispec.models import linear as linear_module
from verispec.models import native_linear
from verispec.models.linear import (
    Linear,
    choose_backend,
    exactly_fp16,
    fp16_kernel_available,
    intel_cpu,
    kernel_for,
    onednn_available,
)
from verispec.models.native_linear import NativeKernel, NativeUnavailable, native_kernel

CPU = torch.device("cpu")
needs_fp16 = pytest.mark.skipif(not fp16_kernel_available(), reason="this build has no FBGEMM")


def weights(out: int, inp: int, fp16_values: bool, seed: int = 0) -> torch.Tensor:
    w = torch.randn(out, inp, generator=torch.Generator().manual_seed(seed)) * 0.05
    return w.half().float() if fp16_values else w


def test_exactly_fp16_worked_example() -> None:
    assert exactly_fp16(torch.tensor([0.5, 1.0009765625, -65504.0, 2.0**-24]))
    for value in (0.1, 1e-8, 70000.0, float("nan")):
        assert not exactly_fp16(torch.tensor([0.5, value])), value


@needs_fp16
def test_auto_keeps_fp16_values_in_fp16_and_rounds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_linear, "native_kernel", lambda: NativeUnavailable("test"))
    assert kernel_for("auto", weights(8, 4, fp16_values=True)) == "fp16"
    expected = "onednn" if onednn_available() and not intel_cpu() else "torch"
    assert kernel_for("auto", weights(8, 4, fp16_values=False)) == expected
    assert kernel_for("torch", weights(8, 4, fp16_values=True)) == "torch"


@pytest.mark.skipif(not isinstance(native_kernel(), NativeKernel), reason="no native kernel here")
def test_auto_takes_the_native_kernel_on_intel_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    for intel in (True, False):
        monkeypatch.setattr(linear_module, "intel_cpu", lambda intel=intel: intel)
        for fp16_values in (True, False):
            kernel = kernel_for("auto", weights(8, 4, fp16_values))
            assert (kernel == "native") == intel
    # float16 values are packed in float16 (half the bytes), others in float32: nothing rounds
    assert Linear(weights(8, 4, True), None, "native").weight.dtype == torch.float16
    assert Linear(weights(8, 4, False), None, "native").weight.dtype == torch.float32


@needs_fp16
def test_fp16_backend_refuses_weights_it_would_round() -> None:
    with pytest.raises(ValueError, match=r"exactly representable.*quantization='fp16'"):
        kernel_for("fp16", weights(8, 4, fp16_values=False))


def test_fp16_backend_needs_float32_on_cpu() -> None:
    with pytest.raises(ValueError, match="fp16 linear backend computes in float32"):
        choose_backend("fp16", CPU, torch.bfloat16)


def skip_unless_built(backend: str) -> None:
    """Skip a kernel this torch build or machine lacks, saying which."""
    if backend == "onednn" and not onednn_available():
        pytest.skip("this torch build has no oneDNN")
    if backend == "fp16" and not fp16_kernel_available():
        pytest.skip("this build has no FBGEMM")
    if backend == "native" and isinstance(reason := native_kernel(), NativeUnavailable):
        pytest.skip(reason.reason)


@pytest.mark.parametrize("backend", ["torch", "onednn", "fp16", "native"])
@pytest.mark.parametrize("rows", [1, 3, 9, 17])
@pytest.mark.parametrize("bias", [False, True])
def test_products_match_float64(backend: str, rows: int, bias: bool) -> None:
    skip_unless_built(backend)
    w = weights(96, 80, fp16_values=True)
    b = torch.randn(96) if bias else None  # float32 bias: never rounded, even by fp16
    x = torch.randn(rows, 80, generator=torch.Generator().manual_seed(1))
    linear = Linear(w, b, choose_backend(backend, CPU, torch.float32))  # type: ignore[arg-type]
    assert linear.kernel == backend
    expected = x.double() @ w.double().T + (b.double() if b is not None else 0)
    torch.testing.assert_close(linear(x).double(), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", ["torch", "onednn", "fp16", "native"])
def test_row_wise_rows_equal_one_row_products(backend: str) -> None:
    skip_unless_built(backend)
    w = weights(64, 3072, fp16_values=True)  # a long K, where kernels split the reduction
    x = torch.randn(9, 3072)
    linear = Linear(w, None, backend, row_wise=True)
    alone = torch.cat([linear(x[i : i + 1]) for i in range(9)])
    assert torch.equal(linear(x), alone)
