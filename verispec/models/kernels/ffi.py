"""The C library's boundary as Python sees it, mirroring native/verispec.h: the ABI version,
the weight formats (WeightFormat, passed as CWeightFormat), the structs layer.c reads (CLinear,
CLayer, CKeys) and the argument and result types of every entry point (`declare`); also the
two libc calls verispec makes (madvise, malloc_trim). tests/models/kernels/test_ffi.py checks
this mirror against the header.

Where the library comes from is build.py's concern, how weights are laid out packing.py's."""

from __future__ import annotations

import ctypes
from enum import IntEnum

ABI_VERSION = 8
"""verispec.h's VERISPEC_ABI_VERSION: a loaded library that reports another is rebuilt."""


class WeightFormat(IntEnum):
    """What a packed weight holds: verispec.h's enum verispec_weight_format, name for name
    (VERISPEC_Q4_F32_DM is Q4_F32_DM here); a packed weight carries its own
    (packing.PackedWeight.format, set by the packer that chose the layout)."""

    F32 = 0
    F16 = 1
    Q8_F32_DM = 2
    Q8_A8 = 3
    Q4_F16_DM = 4
    Q8_F16_D = 5
    Q4_A8 = 6
    Q4_F32_DM = 7
    Q8_F32_DM_HALVES = 8
    Q8_F32_D_HALVES = 9
    Q4_F32_A8 = 10
    Q8_F32_A8 = 11
    Q4_SUPER_DM = 12
    Q4_SUPER_A8 = 13
    Q6_SUPER_D = 14
    Q6_SUPER_A8 = 15


CWeightFormat = ctypes.c_int
"""verispec.h's WeightFormat as C passes it: a C enum is an int (the header's GGMLType too), so
a WeightFormat goes over as int(format)."""


class CLinear(ctypes.Structure):
    """verispec.h's Linear: one product's packed weight (format: its PackedWeight's format; w
    and scales: its codes and scales), bias, out, columns (in_features padded)."""

    _fields_ = [
        ("format", CWeightFormat), ("w", ctypes.c_void_p), ("scales", ctypes.c_void_p),
        ("bias", ctypes.c_void_p), ("out", ctypes.c_int64), ("columns", ctypes.c_int64),
    ]  # fmt: skip


class CLayer(ctypes.Structure):
    """verispec.h's Layer: norms, the four products, the index of its window's mask."""

    _fields_ = [
        *[(name, ctypes.c_void_p) for name in ("input_norm", "post_norm", "q_norm", "k_norm")],
        *[(name, CLinear) for name in ("qkv", "o", "gate_up", "down")],
        ("window", ctypes.c_int64),
    ]


class CKeys(ctypes.Structure):
    """verispec.h's Keys: which cached keys each new row sees (native_layer.KeyPlan's
    pointers)."""

    _fields_ = [("tables", ctypes.c_void_p), ("block_size", ctypes.c_int64),
                ("max_blocks", ctypes.c_int64), ("kv_start", ctypes.c_int64),
                ("cu", ctypes.c_void_p), ("ctx", ctypes.c_void_p),
                ("num_seqs", ctypes.c_int64), ("masks", ctypes.POINTER(ctypes.c_void_p)),
                ("num_masks", ctypes.c_int64), ("max_q", ctypes.c_int64),
                ("max_ctx", ctypes.c_int64)]  # fmt: skip


def declare(lib: ctypes.CDLL) -> None:
    """Argument and result types of the library's entry points, as verispec.h declares them:
    linear.c's product and its queries (portable.c's elsewhere), blocks.c's decoding and
    packing, and layer.c's where the library has it (`_declare_layer_functions`)."""
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    for query in (lib.verispec_abi_version, lib.verispec_linear_isa):
        query.argtypes = []
        query.restype = ctypes.c_int
    lib.verispec_linear.argtypes = [ctypes.c_int, CWeightFormat, *[pointer] * 5, size, size,
                                    size, ctypes.c_int]  # fmt: skip
    lib.verispec_linear.restype = None
    lib.verispec_linear_dot.argtypes = [ctypes.c_int]
    lib.verispec_linear_dot.restype = ctypes.c_int
    lib.verispec_block_codes.argtypes = [ctypes.c_int, *[pointer] * 1, size, *[pointer] * 3,
                                         ctypes.c_int]  # fmt: skip
    lib.verispec_block_codes.restype = ctypes.c_int
    lib.verispec_pack_codes.argtypes = [pointer, size, size, ctypes.c_int, pointer, ctypes.c_int]
    lib.verispec_pack_codes.restype = None
    lib.verispec_q4_k_super.argtypes = [pointer, size, *[pointer] * 4, ctypes.c_int]
    lib.verispec_q4_k_super.restype = None
    lib.verispec_q6_k_super.argtypes = [pointer, size, pointer, pointer, ctypes.c_int]
    lib.verispec_q6_k_super.restype = None
    lib.verispec_pack_q6.argtypes = [pointer, size, size, pointer, ctypes.c_int]
    lib.verispec_pack_q6.restype = None
    if hasattr(lib, "verispec_decoder_stack"):  # layer.c: x86-64 only
        _declare_layer_functions(lib)


def _declare_layer_functions(lib: ctypes.CDLL) -> None:
    """Argument types of layer.c's entry points (see native_layer.py)."""
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    layers, keys, linear = (ctypes.POINTER(s) for s in (CLayer, CKeys, CLinear))
    lib.verispec_decoder_stack.argtypes = [ctypes.c_int, layers, i64, *[p] * 10, keys,
                                           *[i64] * 6, ctypes.c_float, ctypes.c_int, linear, p,
                                           i64, p]  # fmt: skip
    lib.verispec_decoder_stack.restype = None
    lib.verispec_greedy_steps.argtypes = [ctypes.c_int, layers, i64, *[p] * 3, linear, i64,
                                          *[p] * 7, keys, p, *[i64] * 7, ctypes.c_float,
                                          ctypes.c_int, p]  # fmt: skip
    lib.verispec_greedy_steps.restype = None


def release_freed_memory() -> None:
    """Hand freed heap memory back to the system (glibc's malloc_trim): without it, memory a
    load frees (decoded blocks, packing copies) stays in the process and adds to its peak."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the memory is reused, only not returned
        pass


def madvise(address: int, size: int, advice: int) -> None:
    """Linux's madvise over [address, address + size); where it is missing or refused, nothing
    (every advice given here only costs speed or memory when ignored)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise(address, size, advice)
    except (OSError, AttributeError):
        pass
