"""Which kernel a linear layer computes with: the backends a model may ask for, checked against
the device (`choose_backend`), and each weight's kernel (`kernel_for`): the native kernel where
it runs, else float16 weights where exact, else the float32 kernel measured faster here."""

from __future__ import annotations

import functools
import time

import torch

from verispec.models.kernels import build
from verispec.models.kernels.build import NativeKernel, NativeUnavailable
from verispec.models.kernels.quantization import round_to_fp16
from verispec.paths import cache_dir, read_cache_json, write_cache_json
from verispec.types.numerics import ACTIVATION_QUANTIZATIONS, LinearBackend

BACKENDS = ("auto", "torch", "onednn", "fp16", "native")


def onednn_available() -> bool:
    """True when this torch build has oneDNN and its prepacked-linear operators."""
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and all(
        hasattr(ops, name) for name in ("_reorder_linear_weight", "_linear_pointwise")
    )


def fp16_kernel_available() -> bool:
    """True when this torch build has FBGEMM's float16-weight, float32-activation GEMM."""
    ops = torch.ops.quantized
    return "fbgemm" in torch.backends.quantized.supported_engines and all(
        hasattr(ops, name) for name in ("linear_prepack_fp16", "linear_dynamic_fp16")
    )


CHOICE_VERSION = 1
"""Bumped when the measurement below changes, so cached choices are measured again."""


def cpu_model_name() -> str:
    """The CPU's model name (/proc/cpuinfo), the key a measured kernel choice is cached under.
    Only a cache key: no kernel is ever chosen by what it says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def faster_float32_kernel(timings: dict[str, float]) -> str:
    """The float32 kernel with the smallest measured time, "torch" on a tie.

    >>> faster_float32_kernel({"torch": 2.0, "onednn": 1.5})
    'onednn'
    """
    return min(sorted(timings), key=lambda name: (timings[name], name != "torch"))


def _time_float32_kernels() -> dict[str, float]:
    """Median seconds of a one-row product with a [2048, 2048] float32 weight on torch's
    F.linear and on oneDNN's prepacked kernel: which of the two streams float32 weights faster
    depends on the CPU and the BLAS torch was built with, so it is measured, never assumed."""
    weight = torch.randn(2048, 2048)
    x = torch.randn(1, 2048)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight)
    calls = {
        "torch": lambda: torch.nn.functional.linear(x, weight),
        "onednn": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
    }
    timings = {}
    for name, call in calls.items():
        for _ in range(3):
            call()
        times = []
        for _ in range(15):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        timings[name] = sorted(times)[len(times) // 2]
    return timings


@functools.cache
def float32_fallback() -> str:
    """The kernel for float32 weights where the native kernel cannot run: "onednn" or "torch",
    whichever a short measurement on first use found faster on this CPU (cached per CPU model,
    torch version and CHOICE_VERSION in <cache>/kernels/choices.json), "torch" without oneDNN."""
    if not onednn_available():
        return "torch"
    path = cache_dir() / "kernels" / "choices.json"
    key = f"{cpu_model_name()} | torch {torch.__version__} | v{CHOICE_VERSION} | float32 fallback"
    choices = read_cache_json(path)
    if choices.get(key) not in ("torch", "onednn"):
        choices[key] = faster_float32_kernel(_time_float32_kernels())
        write_cache_json(path, choices)
    return str(choices[key])


def native_usable() -> bool:
    """Whether the native kernel built and loaded here: it checks the instruction sets it needs
    (AVX2, F16C and FMA; AVX-512 and VNNI where present) itself, on AMD and Intel alike."""
    return isinstance(build.native_kernel(), NativeKernel)


def exactly_fp16(weight: torch.Tensor) -> bool:
    """True when every value of weight survives a round trip through float16 unchanged.

    Example: 0.5 and 1.0009765625 (= 1 + 2**-10) do; 0.1, 1e-8 and 70000.0 do not.
    Checkpoints stored in float16 always do, so keeping them in float16 loses nothing. The
    first row is tried alone first: most weights that fail (dequantized GGUF ones) fail there,
    which spares a full copy of the matrix.
    """
    head = weight[:1]
    return bool(torch.equal(round_to_fp16(head), head)) and bool(
        torch.equal(round_to_fp16(weight), weight)
    )


def choose_backend(
    backend: LinearBackend, device: torch.device, dtype: torch.dtype, compile: bool = False
) -> str:
    """Check a requested backend against the device and compute dtype (before any weight is read).

    "auto" on a float32 CPU model becomes the per-weight choice described in `kernel_for`; with
    compile, "native" where `kernel_for` would pick it (the compiler keeps its operator as one
    call, product.native_linear_op), else "torch": the prepacked oneDNN and FBGEMM
    weights are opaque objects torch.compile cannot trace, while plain weights become the
    compiler's own library products.
    """
    if backend not in BACKENDS:
        raise ValueError(f"linear backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if compile and backend in ("onednn", "fp16"):
        raise ValueError(
            f"linear_backend={backend!r} cannot be compiled (its prepacked weights are opaque "
            "to torch.compile); use linear_backend='auto', 'native' or 'torch' with compile"
        )
    cpu_fp32 = device.type == "cpu" and dtype == torch.float32
    if backend == "onednn" and not (cpu_fp32 and onednn_available()):
        raise ValueError(
            "the onednn linear backend needs float32 weights on the CPU and a torch build with "
            "oneDNN; use linear_backend='torch' or 'auto'"
        )
    if backend == "fp16" and not (cpu_fp32 and fp16_kernel_available()):
        raise ValueError(
            "the fp16 linear backend computes in float32 on the CPU with float16-stored weights "
            "and needs a torch build with FBGEMM (x86); use linear_backend='torch' or 'auto'"
        )
    if backend == "native" and not cpu_fp32:
        raise ValueError(
            "the native linear backend computes in float32 on the CPU; use linear_backend="
            "'torch' or 'auto' on other devices and dtypes"
        )
    native = build.native_kernel() if backend == "native" else None
    if isinstance(native, NativeUnavailable):
        raise ValueError(f"the native linear kernel cannot run here: {native.reason}")
    if backend == "auto" and not cpu_fp32:
        return "torch"
    if backend == "auto" and compile:
        return "native" if native_usable() else "torch"
    return backend


def kernel_for(backend: str, weight: torch.Tensor, quantization: str | None = None) -> str:
    """The kernel one weight [out, in] runs with, given a backend from `choose_backend`.

    quantization="int8" has its own kernel (torch's `_weight_int8pack_mm`); "fp16" and "q8_0"
    round the weight first, so the rules below then pick the fp16 kernel on a float32 CPU, or
    the native kernel's 8-bit codes for q8_0 where it runs; "a8" and "w8a8" need the native
    kernel (on any CPU it runs on: its integer products are the point).

    "auto" (float32 CPU): "native" wherever it builds and its instruction sets are present
    (verispec's own kernel, product.py: it streams each weight in the fewest bytes that
    hold it exactly, GGUF codes, float16 or float32; chosen by capability, on AMD and Intel
    alike). Without it, "fp16" when the weight is exactly representable in float16 (half the
    bytes), else whichever of F.linear and oneDNN was measured faster here (float32_fallback).
    Why exactness: the output must be the checkpoint's, so a weight is never rounded here
    (rounding is `quantization="fp16"`, which changes the target on purpose).
    """
    if quantization in ACTIVATION_QUANTIZATIONS:
        if backend not in ("auto", "native"):
            raise ValueError(
                f"quantization={quantization!r} runs on the native kernel only (float32 on the "
                f"CPU), but this model's linear kernels are {backend!r}: use dtype float32, "
                "device cpu and linear_backend 'auto' or 'native'"
            )
        native = build.native_kernel()
        if isinstance(native, NativeUnavailable):
            raise ValueError(
                f"quantization={quantization!r} runs on the native kernel only, which cannot "
                f"run here: {native.reason}"
            )
        return "native"
    if quantization == "int8":
        if backend in ("onednn", "fp16"):
            raise ValueError(
                f"quantization='int8' runs its own kernel; linear_backend={backend!r} cannot "
                "apply, use linear_backend='auto'"
            )
        return "int8"
    if backend == "fp16" and not exactly_fp16(weight):
        raise ValueError(
            "linear_backend='fp16' keeps weights in float16 and needs every weight to be exactly "
            "representable there (true for float16 checkpoints); this checkpoint's are not. "
            "Use linear_backend='auto' or 'onednn', or quantization='fp16' to round them"
        )
    if backend != "auto":
        return backend
    if native_usable():
        return "native"
    if fp16_kernel_available() and exactly_fp16(weight):
        return "fp16"
    return float32_fallback()
