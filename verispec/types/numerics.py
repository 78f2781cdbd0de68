"""The names of a model's numerics that configurations carry: the quantizations, their "auto"
values, the linear backends, and the checks of those names. The kernels compute them
(models/kernels/quantization.py, backends.py); config and the CLI only name them."""

from __future__ import annotations

from typing import Literal

QUANTIZATIONS = ("fp16", "int8", "q8_0", "a8", "w8a8", "w4a8")
ACTIVATION_QUANTIZATIONS = ("a8", "w8a8", "w4a8")
"""Products of 8-bit weight codes with inputs rounded to 8-bit blocks of 32, as llama.cpp
computes GGUF models (native kernel, Q8_A8): "a8" for weights stored as codes (GGUF
Q4_1 and Q8_0 blocks), "w8a8" rounding the weights to q8_0 first, "w4a8" to 4-bit codes (Q4_1's
form: `round_to_q4_1`), which a draft model may take to stream half the bytes. Rows are rounded
on their own, so a verify row still equals the decode step of the same input bit for bit."""

AUTO_NUMERICS = "auto"
"""EngineConfig.quantization "auto" (the default): "a8" for a GGUF file whose linear weights are
quantized blocks, run on a float32 CPU model by the native kernel (llama.cpp's own numerics,
the same bits on every instruction-set path), else None (exact float inputs; safetensors
checkpoints always). loader.resolve_quantization decides."""

AUTO_DRAFT = "auto"
"""SpecConfig.quantization "auto" (a named model's own draft runs so): a draft model runs
"w8a8" (or the rounding its catalog entry names, e.g. "w4a8") where the native kernel's 8-bit
products run in integers (AVX-512 VNNI, AVX-VNNI or AVX2: a draft need not be exact, and its
steps then cost much less: docs/benchmarks.md), else as stored; heads as stored."""

LinearBackend = Literal["auto", "torch", "onednn", "fp16", "native"]
"""The kernels a model's linear layers may ask for (models/kernels/backends.py)."""


def check_quantization(
    name: str | None, what: str = "quantization", extra: tuple[str, ...] = ()
) -> None:
    """ValueError unless name is None or one of QUANTIZATIONS (or extra: AUTO_NUMERICS for a
    target, AUTO_DRAFT for a draft)."""
    problem = quantization_problem(name, extra)
    if problem is not None:
        raise ValueError(f"{what} {problem}")


def quantization_problem(name: str | None, extra: tuple[str, ...] = ()) -> str | None:
    """What is wrong with a quantization name, after the name of what it sets (None: nothing).
    Example: "q4" -> "must be one of fp16, int8, q8_0, a8, w8a8, w4a8 or None (off); got 'q4'"."""
    allowed = (*QUANTIZATIONS, *extra)
    if name is not None and name not in allowed:
        return f"must be one of {', '.join(allowed)} or None (off); got {name!r}"
    return None


def check_compile(compile: bool, batch_invariant: bool) -> None:
    """Batch-invariant mode stays eager: its row-by-row products are the exactness reference."""
    if compile and batch_invariant:
        raise ValueError(
            "compile cannot be combined with batch_invariant: batch-invariant mode runs row by "
            "row in eager mode, the exactness reference; turn one of them off"
        )
