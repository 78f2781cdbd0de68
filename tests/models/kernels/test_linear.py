"""Linear kernels: which one each weight gets, and that every one computes x W^T + b exactly
enough (float64 reference) without rounding a weight it was not asked to round."""

from __future__ import annotations

import pytest
import torch

from verispec.models.kernels import backends, build
from verispec.models.kernels.backends import (
    choose_backend,
    exactly_fp16,
    faster_float32_kernel,
    float32_fallback,
    fp16_kernel_available,
    kernel_for,
    onednn_available,
)
from verispec.models.kernels.build import NativeKernel, NativeUnavailable, native_kernel
from verispec.models.kernels.ffi import WeightFormat
from verispec.models.kernels.linear import Linear

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
    monkeypatch.setattr(build, "native_kernel", lambda: NativeUnavailable("test"))
    assert kernel_for("auto", weights(8, 4, fp16_values=True)) == "fp16"
    assert kernel_for("auto", weights(8, 4, fp16_values=False)) == float32_fallback()
    assert kernel_for("torch", weights(8, 4, fp16_values=True)) == "torch"


@pytest.mark.skipif(not isinstance(native_kernel(), NativeKernel), reason="no native kernel here")
@pytest.mark.parametrize("vendor", ["GenuineIntel", "AuthenticAMD"])
def test_auto_takes_the_native_kernel_whatever_the_vendor(
    vendor: str, monkeypatch: pytest.MonkeyPatch, tmp_path: pytest.TempPathFactory
) -> None:
    """The same instruction sets give the same choice on either vendor: nothing reads vendor_id
    (a fake /proc/cpuinfo naming each vendor changes no kernel)."""
    import builtins

    cpuinfo = f"vendor_id\t: {vendor}\nmodel name\t: test cpu\nflags\t: avx2 fma f16c\n"
    real_open = builtins.open

    def fake_open(file, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(file) == "/proc/cpuinfo":
            import io

            return io.StringIO(cpuinfo)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    for fp16_values in (True, False):
        assert kernel_for("auto", weights(8, 4, fp16_values)) == "native"
    assert choose_backend("auto", CPU, torch.float32, compile=True) == "native"
    # float16 values are packed in float16 (half the bytes), others in float32: nothing rounds
    halves, floats = (Linear(weights(8, 4, v), None, "native").packed for v in (True, False))
    assert halves is not None and halves.format == WeightFormat.F16
    assert halves.codes.dtype == torch.float16
    assert floats is not None and floats.format == WeightFormat.F32
    assert floats.codes.dtype == torch.float32


def test_the_float32_fallback_is_the_faster_measured_kernel() -> None:
    assert faster_float32_kernel({"torch": 2.0, "onednn": 1.5}) == "onednn"
    assert faster_float32_kernel({"torch": 1.0, "onednn": 1.5}) == "torch"
    assert faster_float32_kernel({"torch": 1.0, "onednn": 1.0}) == "torch"


def test_the_float32_fallback_is_measured_once_and_cached(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pytest.TempPathFactory
) -> None:
    if not onednn_available():
        pytest.skip("this torch build has no oneDNN: the fallback is always torch")
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    calls = []

    def timings() -> dict[str, float]:
        calls.append(1)
        return {"torch": 3.0, "onednn": 1.0}

    monkeypatch.setattr(backends, "_time_float32_kernels", timings)
    for _ in range(2):
        float32_fallback.cache_clear()
        assert float32_fallback() == "onednn"
    float32_fallback.cache_clear()
    assert calls == [1], "the second process-level call reads the cached choice"


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
