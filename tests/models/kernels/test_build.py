"""The native library (build.py): built once into the cache, or clear reasons when it cannot
be (no compiler, turned off, another ABI), and its header mirrored by ffi.py."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
import torch

from verispec.models.kernels import build, ffi
from verispec.models.kernels.backends import choose_backend, kernel_for
from verispec.models.kernels.build import NativeKernel, NativeUnavailable, native_kernel
from verispec.models.weights.gguf_blocks import CODED_TYPES

CPU = torch.device("cpu")
KERNEL = native_kernel()
needs_kernel = pytest.mark.skipif(
    not isinstance(KERNEL, NativeKernel),
    reason=f"the native kernel cannot run here: {getattr(KERNEL, 'reason', '')}",
)


@pytest.fixture
def fresh_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An empty kernel cache and a forgotten kernel, restored afterwards."""
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    native_kernel.cache_clear()
    yield tmp_path
    native_kernel.cache_clear()


def test_a_failing_build_says_why_and_auto_falls_back(
    fresh_build: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CC", "false")
    with caplog.at_level(logging.WARNING, logger="verispec"):
        reason = native_kernel()
    assert isinstance(reason, NativeUnavailable) and "failed" in reason.reason
    assert "native linear kernel cannot run here" in caplog.text
    with pytest.raises(ValueError, match=r"native linear kernel cannot run here.*failed"):
        choose_backend("native", CPU, torch.float32)
    assert kernel_for("auto", torch.randn(8, 4)) != "native"


def test_it_can_be_turned_off(fresh_build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERISPEC_NATIVE_LINEAR", "0")
    reason = native_kernel()
    assert isinstance(reason, NativeUnavailable) and "VERISPEC_NATIVE_LINEAR=0" in reason.reason


@needs_kernel
def test_a_fresh_cache_builds_the_library_once(fresh_build: Path) -> None:
    assert isinstance(native_kernel(), NativeKernel)
    built = list((fresh_build / "kernels").glob("native-*.so"))
    assert len(built) == 1 and not list((fresh_build / "kernels").glob("tmp*"))


def test_the_header_and_the_python_enum_name_the_same_formats() -> None:
    """verispec.h's enum and ffi.WeightFormat agree name for name and value for value, and so
    do their ABI versions; its GGML types are gguf-py's GGMLQuantizationType values for the
    types gguf_blocks decodes: a change on one side alone fails here."""
    import re

    text = build.HEADER.read_text()
    enum = dict(re.findall(r"VERISPEC_(\w+) = (\d+),", text))
    formats = {name: int(v) for name, v in enum.items() if not name.startswith("GGML_")}
    assert formats == {f.name: f.value for f in ffi.WeightFormat}
    ggml = {
        name.removeprefix("GGML_"): int(v) for name, v in enum.items() if name.startswith("GGML_")
    }
    assert ggml == {t.name: t.value for t in CODED_TYPES}  # blocks.c's types: gguf-py's numbers
    [abi] = re.findall(r"#define VERISPEC_ABI_VERSION (\d+)", text)
    assert int(abi) == ffi.ABI_VERSION


@needs_kernel
def test_an_abi_mismatch_is_refused_loudly(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pytest.TempPathFactory
) -> None:
    """A library whose ABI is not ffi.ABI_VERSION is rebuilt once, then refused. The builds
    copy this process's library (the compiler's own run is the test above: each real build
    takes a minute on 2 busy cores)."""
    built = Path(build.library_path(build._compiler()))  # what native_kernel() loaded
    builds: list[Path] = []

    def copy_build(compiler: str, target: Path) -> None:  # atomic, as build.build is
        builds.append(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, target.with_suffix(".tmp"))
        os.replace(target.with_suffix(".tmp"), target)

    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(build, "build", copy_build)
    monkeypatch.setattr(ffi, "ABI_VERSION", ffi.ABI_VERSION + 1)
    result = build._load()
    assert isinstance(result, NativeUnavailable)
    assert "reports ABI" in result.reason and "disagree" in result.reason
    assert len(builds) == 2 and builds[0] == builds[1]  # the first build, then the rebuild
