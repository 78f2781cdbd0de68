"""Measured target-step profiles kept in the cache (`<cache>/kernels/profiles.json`), so a
later load of the same model with the same settings on the same machine skips the start-up
forwards (engine.Engine._profile_target). A profile is only the adaptive policy's first cost
model: measured steps replace it online (engine/spec_policy.py)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from verispec.models.kernels.build import NativeKernel, native_kernel
from verispec.paths import cache_dir

MAX_ENTRIES = 64
"""Profiles kept; the oldest go first (test runs make models in temporary directories)."""


def files_key(path: Path) -> list[object]:
    """The model's identity for a profile: each file's name, size and modification time (the
    file itself, or a checkpoint directory's files)."""
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    return [str(path.resolve()), *[(f.name, f.stat().st_size, f.stat().st_mtime_ns)
                                   for f in files]]  # fmt: skip


def kernel_key() -> str | None:
    """The native library in use (its file is named by a hash of its sources), or None."""
    kernel = native_kernel()
    return Path(kernel.lib._name).name if isinstance(kernel, NativeKernel) else None


def _path() -> Path:
    return cache_dir() / "kernels" / "profiles.json"


def _key(facts: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


def _read() -> dict[str, dict]:
    try:
        entries = json.loads(_path().read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def load(facts: dict[str, object]) -> dict[int, float] | None:
    """The profile stored for these facts ({tokens: seconds}), or None."""
    entry = _read().get(_key(facts))
    try:
        profile = {int(k): float(v) for k, v in entry["profile"].items()}  # type: ignore[index]
    except (TypeError, KeyError, ValueError, AttributeError):
        return None
    return profile if profile and all(v > 0 for v in profile.values()) else None


def store(facts: dict[str, object], profile: dict[int, float]) -> None:
    """Keep profile for these facts (atomically; an unwritable cache only means measuring
    again next time)."""
    entries = _read()
    entries.pop(_key(facts), None)
    entries[_key(facts)] = {"profile": {str(k): v for k, v in profile.items()}}
    entries = dict(list(entries.items())[-MAX_ENTRIES:])  # insertion order: newest last
    path = _path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entries))
        os.replace(tmp, path)
    except OSError:
        pass
