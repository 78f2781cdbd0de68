"""Measured target-step profiles kept in the cache (`<cache>/kernels/profiles.json`), so a
later load of the same model with the same settings on the same machine skips the start-up
forwards (engine.Engine._profile_target). A profile is only the adaptive policy's first cost
model: measured steps replace it online (engine/spec_policy.py)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from verispec.models.kernels.build import NativeKernel, native_kernel
from verispec.paths import cache_dir, read_cache_json, write_cache_json

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


def load(facts: dict[str, object]) -> dict[int, float] | None:
    """The profile stored for these facts ({tokens: seconds}), or None."""
    entry = read_cache_json(_path()).get(_key(facts))
    try:
        profile = {int(k): float(v) for k, v in entry["profile"].items()}  # type: ignore[index]
    except (TypeError, KeyError, ValueError, AttributeError):
        return None
    return profile if profile and all(v > 0 for v in profile.values()) else None


def store(facts: dict[str, object], profile: dict[int, float]) -> None:
    """Keep profile for these facts, dropping the least recently stored beyond MAX_ENTRIES."""
    entries = read_cache_json(_path())
    entries[_key(facts)] = {"stored": time.time(), "profile": {str(k): v
                                                              for k, v in profile.items()}}
    newest = sorted(entries, key=lambda k: _stored(entries[k]))[-MAX_ENTRIES:]
    write_cache_json(_path(), {k: entries[k] for k in newest})


def _stored(entry: object) -> float:
    """When an entry was stored (0 for one without a time)."""
    stored = entry.get("stored", 0) if isinstance(entry, dict) else 0
    return float(stored) if isinstance(stored, int | float) else 0.0
