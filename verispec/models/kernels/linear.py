"""Linear: y = x W^T + b with the fastest exact kernel the device has for decode and verify."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence
from typing import Literal, cast

import torch

from verispec.models.kernels import affine, arena, build, packing, product
from verispec.models.kernels.affine import AffineCodes, dequantize_codes
from verispec.models.kernels.build import NativeKernel, NativeUnavailable
from verispec.models.kernels.ffi import WeightFormat
from verispec.models.kernels.packing import PackedWeight
from verispec.models.kernels.quantization import (
    ACTIVATION_QUANTIZATIONS,
    int8_per_channel,
    round_to_fp16,
    round_to_q8_0,
)
from verispec.paths import cache_dir, read_cache_json, write_cache_json

LinearBackend = Literal["auto", "torch", "onednn", "fp16", "native"]
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


def cpu_model() -> str:
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
    key = f"{cpu_model()} | torch {torch.__version__} | v{CHOICE_VERSION} | float32 fallback"
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


PACK_ROWS = 2048
"""Rows of codes packed at a time (a multiple of the kernel's 16-row blocks)."""


def pack_codes_by_rows(codes: AffineCodes) -> PackedWeight:
    """packing.pack_codes, PACK_ROWS rows at a time into one preallocated output, so a
    large weight (a 150k-row LM head) never has several whole copies alive while it packs.
    The packed layout is blocked by 16 rows, so the pieces are the whole's rows; if a piece
    would pick another format than the first (e.g. one whose m happen to be all zero), the
    whole weight is packed at once instead."""
    rows = codes.codes.shape[0]
    if rows <= PACK_ROWS:
        return packing.pack_codes(codes)
    pieces = range(0, rows, PACK_ROWS)

    def piece(start: int) -> PackedWeight:
        part = slice(start, start + PACK_ROWS)
        factors = None if codes.super_scales is None else codes.super_scales.rows(part)
        return packing.pack_codes(AffineCodes(codes.codes[part], codes.d[part],
                                              codes.m[part], codes.group,
                                              factors))  # fmt: skip

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
            return packing.pack_codes(codes)
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
}
"""What each of the native kernel's weight formats holds, for the settings users see."""
A8_FORMATS = (WeightFormat.Q8_A8, WeightFormat.Q4_A8, WeightFormat.Q4_F32_A8,
              WeightFormat.Q8_F32_A8, WeightFormat.Q4_SUPER_A8)


def kernels_in_use(linears: Sequence[Linear]) -> dict[str, str]:
    """Which kernel each weight format of these layers runs with, e.g. {"4-bit codes, float32
    d and m (Q4_K)": "native avx2"}: printed in `verispec generate --json` settings and the
    server's start line, so a figure always says what computed it."""
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
            name += " vnni" if kernel.vnni else " (portable 8-bit loop)"
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
            if keep and quantization in (None, *ACTIVATION_QUANTIZATIONS):
                codes = weight
            weight = dequantize_codes(weight) if codes is None else weight.codes
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        if quantization == "fp16":
            weight = round_to_fp16(weight)
        elif quantization in ("q8_0", "w8a8"):
            weight = round_to_q8_0(weight)
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
                self.packed = packing.pack_codes_a8(codes)
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
