"""The C library's boundary as Python sees it, mirroring native/verispec.h: the ABI version,
the weight formats (WeightFormat), and the argument and result types of every entry point
(`declare`); also the two libc calls verispec makes (madvise, malloc_trim).

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


def declare(lib: ctypes.CDLL) -> None:
    """Argument and result types of the library's entry points: linear.c's product and its
    dot product's query (portable.c's elsewhere), blocks.c's decoding and packing, and layer.c's
    where the library has it
    (`_declare_layer_functions`)."""
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    lib.verispec_linear.argtypes = [ctypes.c_int, ctypes.c_int, *[pointer] * 5, size, size,
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
    lib.verispec_decoder_stack.argtypes = [ctypes.c_int, p, i64, *[p] * 11, *[i64] * 6,
                                           ctypes.c_float, ctypes.c_int, p, p, i64,
                                           p]  # fmt: skip
    lib.verispec_decoder_stack.restype = None
    lib.verispec_greedy_steps.argtypes = [ctypes.c_int, p, i64, *[p] * 4, i64, *[p] * 9,
                                          *[i64] * 7, ctypes.c_float, ctypes.c_int, p]  # fmt: skip
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
