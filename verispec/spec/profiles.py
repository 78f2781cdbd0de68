"""The start-up profile of target steps: forwards of 1, 2, 4, 8 and 16 new tokens timed when an
adaptive engine loads (target_cost), the adaptive policy's first cost model; measured steps
replace it online (spec/cost.py, MeasuredStepCost). A profile is kept in the cache
(`<cache>/kernels/profiles.json`) per model file, settings, threads, CPU and kernel, so a later
load of the same model with the same settings on the same machine skips the forwards."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from verispec.models.kernels.backends import cpu_model_name
from verispec.models.kernels.build import NativeKernel, native_kernel
from verispec.models.paged import PagedModel
from verispec.paths import cache_dir, read_cache_json, write_cache_json
from verispec.spec.cost import MeasuredStepCost

if TYPE_CHECKING:
    from verispec.config import EngineConfig

PROFILE_TOKENS = 16
"""The largest target step timed at start-up."""
PROFILE_RUNS = 3
"""Timed forwards per token count at start-up; the fastest counts (other work on the machine
only ever adds time, and one slowed run made drafts look dear for the whole first window)."""

MAX_ENTRIES = 64
"""Profiles kept; the oldest go first (test runs make models in temporary directories)."""


def target_cost(target: PagedModel, facts: dict[str, object]) -> MeasuredStepCost:
    """The cost model of target steps with the profile stored for these facts, else with a new
    one: forwards of 1, 2, 4, 8 and 16 new tokens (up to facts["limit"]), each the fastest of
    PROFILE_RUNS timed runs after an untimed one, then stored. Larger steps are extrapolated from
    the last segment (spec/cost.py, _interpolate), which is linear there, and learned online:
    timing up to 64 tokens made loading a 1.5B model several seconds longer (docs/design.md,
    10)."""
    known = load(facts)
    if known is not None:
        return MeasuredStepCost(profile=known)
    cost = MeasuredStepCost()
    for tokens in (t for t in (1, 2, 4, 8, 16) if t <= int(facts["limit"])):
        cost.profile[tokens] = target.time_forward(tokens, PROFILE_RUNS)
    store(facts, cost.profile)
    return cost


def facts(
    config: EngineConfig, model_path: Path, dtype: torch.dtype, device: torch.device,
    max_model_len: int,
) -> dict[str, object]:  # fmt: skip
    """What a target step's cost depends on: the model's files, the settings that change its
    kernels, the step limit, threads, CPU model, torch and the native library built; and how
    the profile was timed (PROFILE_RUNS), so one timed otherwise is not reused."""
    c = config
    return {
        "model": files_key(model_path), "dtype": str(dtype), "device": str(device),
        "linear_backend": c.linear_backend, "quantization": c.quantization,
        "batch_invariant": c.batch_invariant, "compile": c.compile,
        "limit": min(c.max_num_batched_tokens, max_model_len - 1, PROFILE_TOKENS),
        "runs": PROFILE_RUNS,
        "threads": torch.get_num_threads(), "cpu": cpu_model_name(), "torch": torch.__version__,
        "kernel": kernel_key(),
    }  # fmt: skip


def files_key(path: Path) -> list[object]:
    """The model's identity for a profile: each file's name, size and modification time (the
    file itself, or a checkpoint directory's files)."""
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    return [str(path.resolve()), *[(f.name, f.stat().st_size, f.stat().st_mtime_ns)
                                   for f in files]]  # fmt: skip


def kernel_key() -> str | None:
    """The native library in use (its file is named by a hash of its sources) and the path it
    runs (instruction sets, 8-bit dot product: VERISPEC_ISA can narrow it), or None."""
    kernel = native_kernel()
    if not isinstance(kernel, NativeKernel):
        return None
    return f"{Path(kernel.lib._name).name} {kernel.isa_name} {kernel.dot_name}"


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
