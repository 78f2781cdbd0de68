"""The native kernel's library: the C sources in native/ (linear.c, layer.c, blocks.c,
portable.c, verispec.h) built once with the system's C compiler and loaded through ctypes.

The library is compiled into the cache (`<cache>/kernels/`) on first use (tens of seconds: the
AVX-512, AVX2 and AVX-VNNI products); without a compiler `native_kernel()` says why and the
linear layers use torch's kernels instead. On x86-64 the products use AVX-512 or AVX2 + F16C +
FMA where the CPU has them, else portable.c's plain C, as on every other machine (whose library
is portable.c and blocks.c: products and loading, no native decoder stack). A cached library
whose ABI version is not ffi.ABI_VERSION is rebuilt, never misread.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from verispec.models.kernels import ffi
from verispec.paths import cache_dir

NATIVE = Path(__file__).with_name("native")
HEADER = NATIVE / "verispec.h"
"""The C side of the boundary: WeightFormat's enum, the ABI version, the entry points."""
INCLUDED = (HEADER, NATIVE / "a8_avx2.h")
"""The headers the sources include (hashed with them: linear.c includes a8_avx2.h twice)."""
FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC")
LIBS = ("-lm",)

ISA_NAMES = {"portable": 0, "avx2": 1, "avx512": 2}
"""VERISPEC_ISA's values: the widest instruction sets the kernels may use (verispec.h's isa)."""
DOT_NAMES = ("scalar", "maddubs", "avx-vnni", "vnni")
"""The 8-bit products' integer dot products by verispec.h's VERISPEC_DOT_* number: the portable
loop, AVX2's vpmaddubsw, AVX-VNNI's and AVX-512 VNNI's vpdpbusd."""
log = logging.getLogger("verispec")


def sources(machine: str | None = None) -> tuple[Path, ...]:
    """The C sources built together into one library on this machine (platform.machine(), or
    the one named): on x86-64 the products (linear.c, with portable.c for CPUs without its
    instruction sets), the decoder layer's other work (layer.c, used by native_layer.py), and a
    GGUF file's blocks decoded and packed as codes (blocks.c, for loading); elsewhere portable.c,
    whose plain C stands in for linear.c's entry points there, and blocks.c.

    >>> [p.name for p in sources("aarch64")]
    ['portable.c', 'blocks.c']
    """
    machine = (machine or platform.machine()).lower()
    if machine in ("x86_64", "amd64"):
        return tuple(NATIVE / name for name in ("linear.c", "layer.c", "blocks.c", "portable.c"))
    return (NATIVE / "portable.c", NATIVE / "blocks.c")


@dataclass(frozen=True)
class NativeKernel:
    """The loaded library and the instruction sets it runs with on this CPU (capped by
    VERISPEC_ISA)."""

    lib: ctypes.CDLL
    isa: int
    """2 = AVX-512, 1 = AVX2 + F16C + FMA, 0 = portable C (portable.c)."""
    dot: int = 0
    """The integer dot product of the 8-bit products ("a8", "w8a8", "w4a8"), a DOT_NAMES index:
    3 = AVX-512 VNNI, 2 = AVX-VNNI, 1 = AVX2's vpmaddubsw, 0 = the scalar loop. Every one gives
    the same bits."""
    stack: bool = True
    """The native decoder stack (layer.c, native_layer.py) runs here: x86-64 code that needs
    AVX2 and FMA. Where it does not, models run their layers in torch around the products."""

    @property
    def isa_name(self) -> str:
        return next(name for name, isa in ISA_NAMES.items() if isa == self.isa)

    @property
    def dot_name(self) -> str:
        return DOT_NAMES[self.dot]

    @property
    def vnni(self) -> bool:
        """The 8-bit products run on AVX-512 VNNI here."""
        return self.dot == 3

    @property
    def isa_arg(self) -> int:
        """The isa argument of the library's entry points: the instruction sets, and the dot
        product in bits 2-3 (verispec.h)."""
        return self.isa | self.dot << 2

    def paths(self) -> list[NativeKernel]:
        """This kernel on every instruction set and dot product it can narrow to, narrowest
        first (this one last): the paths whose products tests and benchmarks compare."""
        return [NativeKernel(self.lib, isa, dot, isa >= 1 and self.stack)
                for isa in range(self.isa + 1)
                for dot in range(self.lib.verispec_linear_dot(isa) + 1)
                if (dot == 0) == (isa == 0) and (isa, dot) <= (self.isa, self.dot)]  # fmt: skip


@dataclass(frozen=True)
class NativeUnavailable:
    """Why the native kernel cannot run here (no compiler, a failed build, an old CPU)."""

    reason: str


def _compiler() -> str | None:
    """$CC when set, else the first of cc, gcc, clang on PATH."""
    if os.environ.get("CC"):
        return os.environ["CC"]
    return next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)


def library_path(compiler: str) -> Path:
    """Where the built library is cached: named by a hash of the source, flags and compiler."""
    key = hashlib.sha256(b"".join(source.read_bytes() for source in (*sources(), *INCLUDED)))
    key.update(" ".join((compiler, *FLAGS, *LIBS)).encode())
    return cache_dir() / "kernels" / f"native-{key.hexdigest()[:16]}.so"


def build(compiler: str, target: Path) -> None:
    """Compile the sources into target (atomically: concurrent builds never see half a file)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        done = subprocess.run(
            [compiler, *FLAGS, "-o", str(out), *map(str, sources()), *LIBS],
            capture_output=True, text=True, timeout=600,
        )
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip()[-2000:] or f"{compiler} failed")
        os.replace(out, target)


@functools.cache
def native_kernel() -> NativeKernel | NativeUnavailable:
    """The native kernel, built and loaded once per process, or why it cannot be (logged once
    as a warning: linear layers then run torch's kernels, slower on Intel CPUs).

    Set VERISPEC_NATIVE_LINEAR=0 to turn it off (linear_backend="auto" then picks among torch's
    kernels as before), VERISPEC_ISA to cap its instruction sets (isa_cap).
    """
    if os.environ.get("VERISPEC_NATIVE_LINEAR", "1") == "0":
        return NativeUnavailable("turned off by VERISPEC_NATIVE_LINEAR=0")
    result = _load(isa_cap())
    if isinstance(result, NativeUnavailable):
        log.warning("the native linear kernel cannot run here (%s); using torch's kernels",
                    result.reason)  # fmt: skip
    return result


def isa_cap() -> int:
    """The widest instruction sets VERISPEC_ISA lets the kernels use (ISA_NAMES; unset: all).
    The kernel's isa is the smaller of the CPU's and this, its dot product the widest the CPU
    has at that isa; "portable" (0) runs the portable code. Example: VERISPEC_ISA=avx2 on an
    AVX-512 VNNI CPU runs the AVX2 products, the 8-bit ones on AVX-VNNI where the CPU has it."""
    name = os.environ.get("VERISPEC_ISA", "avx512")
    if name not in ISA_NAMES:
        raise ValueError(f"VERISPEC_ISA must be one of {', '.join(ISA_NAMES)}; got {name!r}")
    return ISA_NAMES[name]


def _load(cap: int = 2) -> NativeKernel | NativeUnavailable:
    """Build (when not cached) and load the library, check the CPU, and cap its isa at cap."""
    compiler = _compiler()
    if compiler is None:
        return NativeUnavailable("no C compiler (cc, gcc or clang) on PATH; set CC to one")
    path = library_path(compiler)
    try:
        if not path.exists():
            build(compiler, path)
        lib = ctypes.CDLL(str(path))
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        names = ", ".join(source.name for source in sources())
        return NativeUnavailable(f"building {names} with {compiler} failed: {error}")
    if not hasattr(lib, "verispec_abi_version") or lib.verispec_abi_version() != ffi.ABI_VERSION:
        try:  # a library from other sources under this name: rebuild it, never misread it
            build(compiler, path)
            lib = ctypes.CDLL(str(path))
        except (OSError, RuntimeError, subprocess.SubprocessError) as error:
            return NativeUnavailable(f"rebuilding the native library failed: {error}")
        if lib.verispec_abi_version() != ffi.ABI_VERSION:
            return NativeUnavailable(
                f"the native library reports ABI {lib.verispec_abi_version()}, verispec "
                f"expects {ffi.ABI_VERSION} (native/verispec.h and ffi.py disagree)"
            )
    isa = min(lib.verispec_linear_isa(), cap)
    ffi.declare(lib)
    stack = isa >= 1 and hasattr(lib, "verispec_decoder_stack")
    return NativeKernel(lib, isa, lib.verispec_linear_dot(isa), stack)


def loaded() -> NativeKernel:
    """The kernel, for callers that hold packed weights (which exist only where it loaded)."""
    kernel = native_kernel()
    assert isinstance(kernel, NativeKernel), "packed weights exist only where the kernel loaded"
    return kernel
