"""The cache directory every part of verispec shares (verispec/paths.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from verispec.paths import cache_dir


def test_cache_dir_prefers_verispec_cache_then_xdg_then_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("VERISPEC_CACHE")
    assert cache_dir() == tmp_path / "xdg" / "verispec"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert cache_dir() == tmp_path / "home" / ".cache" / "verispec"
