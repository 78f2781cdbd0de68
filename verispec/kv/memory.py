"""Memory of the KV pools: a budget's default for a machine, what a pool holds, this process's
resident memory, and sizes as people write them ("4GiB"). The pools are committed when made
(kv/cache.py), so what start-up reports is what they take under load."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

import torch

DEFAULT_KV_FRACTION = 0.1
"""Without a budget, the target's KV pool takes at most this fraction of the device's memory
(the machine's RAM on a CPU, the GPU's own on CUDA), and no more than max_num_seqs sequences of
max_model_len need; never less than one such sequence. RAM is shared with the rest of the
machine, and a pool smaller than the worst case only means preemption when every seat holds a
long context (docs/design.md, 5)."""

UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "kb": 10**3, "m": 2**20, "mib": 2**20,
         "mb": 10**6, "g": 2**30, "gib": 2**30, "gb": 10**9, "t": 2**40, "tib": 2**40,
         "tb": 10**12}  # fmt: skip
"""Size suffixes, case-insensitive: K, M, G, T and KiB, MiB, GiB, TiB are powers of 1024; KB,
MB, GB, TB powers of 1000."""


@dataclass(frozen=True, slots=True)
class KVMemory:
    """The KV pools an engine committed at start: the target's, and a drafter's own (a draft
    model, an EAGLE head, self-speculation's kept layers; 0 for drafters without one)."""

    target_bytes: int
    drafter_bytes: int
    num_tokens: int
    """Token slots of the target's pool (blocks x block size)."""
    max_model_len: int

    @property
    def total_bytes(self) -> int:
        return self.target_bytes + self.drafter_bytes

    def describe(self) -> str:
        """For a start-up message, e.g. 'KV cache 2.25 GiB committed: 49,152 tokens, 6.0
        sequences of 8,192' (and the drafter's own, when it has one)."""
        sequences = self.num_tokens / self.max_model_len
        text = (f"KV cache {format_size(self.target_bytes)} committed: {self.num_tokens:,} "
                f"tokens, {sequences:.1f} sequences of {self.max_model_len:,}")  # fmt: skip
        if self.drafter_bytes:
            text += f", and the drafter's {format_size(self.drafter_bytes)}"
        return text


def kv_pool_bytes(
    budget: int | None, block_bytes: int, blocks_per_seq: int, max_num_seqs: int,
    device: torch.device,
) -> int:  # fmt: skip
    """The bytes of the target's pool: the budget given, else the default (DEFAULT_KV_FRACTION
    of the device's memory, within one and max_num_seqs sequences of max_model_len).

    >>> mib, cpu = 2**20, torch.device("cpu")  # blocks of 1 MiB, 8 to a sequence
    >>> kv_pool_bytes(None, mib, 8, 4, cpu) // mib  # 4 sequences: far below a tenth of RAM
    32
    >>> kv_pool_bytes(3 * mib + 5, mib, 8, 4, cpu)  # a budget given is taken as it is
    3145733
    """
    if budget is not None:
        return budget
    one, most = blocks_per_seq * block_bytes, max_num_seqs * blocks_per_seq * block_bytes
    total = device_memory(device)
    cap = most if total is None else int(DEFAULT_KV_FRACTION * total)
    return min(most, max(one, cap))


def check_fits(pool_bytes: int, device: torch.device, what: str) -> None:
    """ValueError when the device has less memory available than pool_bytes (the pool is
    committed at once: on a CPU it would be swapped or killed, on a GPU it would not allocate);
    `what` says which settings to change."""
    free = available_memory(device)
    if free is not None and pool_bytes > free:
        raise ValueError(f"the KV cache needs {format_size(pool_bytes)} but only "
                         f"{format_size(free)} of memory are available on {device.type}; "
                         f"{what}")  # fmt: skip


def device_memory(device: torch.device) -> int | None:
    """Bytes of memory of the device: the machine's physical RAM for a CPU, the GPU's for
    CUDA; None where it cannot be read."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def available_memory(device: torch.device) -> int | None:
    """Bytes the device can still give: Linux's MemAvailable for a CPU, free GPU memory for
    CUDA; None where it cannot be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def resident_bytes() -> int | None:
    """This process's resident memory in bytes (Linux's /proc/self/statm), None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def parse_size(text: str) -> int:
    """Bytes from a size as written: '2GiB', '512M', '1.5 GB', '1073741824' (UNITS).

    >>> parse_size("2GiB"), parse_size("512m"), parse_size("1.5 GB"), parse_size("4096")
    (2147483648, 536870912, 1500000000, 4096)
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in UNITS:
        raise ValueError(f"a size must be a number of bytes with an optional unit (K, M, G, T, "
                         f"KiB, ..., KB, ...), e.g. 4GiB or 512M; got {text!r}")  # fmt: skip
    size = float(match.group(1)) * UNITS[unit]
    if not math.isfinite(size) or size < 1:
        raise ValueError(f"a size must be at least 1 byte, got {text!r}")
    return int(size)


def format_size(size: int) -> str:
    """A size in binary units for people: '2.25 GiB', '512.0 MiB', '900 B'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            digits = 2 if size < 10 * scale else 1
            return f"{size / scale:.{digits}f} {unit}"
    return f"{size} B"
