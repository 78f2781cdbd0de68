"""The facts every benchmark prints beside its figures (the machine, its load, torch, the
date), and the aligned `key: value` lines they are printed as; `verispec bench` and the
scripts in benchmarks/ share them."""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path
from typing import Any


def run_facts(load_before: float) -> dict[str, str]:
    """The machine facts every benchmark prints beside its figures: torch, CPU, the 1-minute
    load average at start (load_before) and now, and the date."""
    import torch

    return {
        "torch": torch.__version__,
        "cpu": cpu_description(),
        "load_1min": f"{load_before:.2f} at start, {os.getloadavg()[0]:.2f} at end",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def print_settings(settings: dict[str, Any]) -> None:
    """One right-aligned `key: value` line per setting."""
    width = max(map(len, settings), default=0)
    for key, value in settings.items():
        print(f"{key:>{width}}: {value}")


def cpu_description() -> str:
    """Model name, family/model numbers and vector extensions (the name alone can be vague)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    info: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    if "model name" not in info:
        return platform.processor() or "unknown"
    flags = info.get("flags", "").split()
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return (f"{info['model name']} (family {info.get('cpu family')} model {info.get('model')}, "
            f"{' '.join(isa)}; {os.cpu_count()} cpus)")  # fmt: skip
