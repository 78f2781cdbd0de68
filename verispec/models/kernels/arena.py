"""The packed weights of a model copied in order into one arena of huge pages (`into_arena`),
so a decode step's products stream through memory one after another."""

from __future__ import annotations

import torch

from verispec.models.kernels.ffi import madvise, release_freed_memory

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14  # Linux


def into_arena(packed: list[torch.Tensor]) -> list[torch.Tensor]:
    """The packed weights copied, in this order, into one buffer aligned to 2 MiB that Linux is
    asked to back with transparent huge pages; views of it, in the same order.

    Why: a decode step runs its products one after another, each over a few megabytes. Apart,
    each starts cold on 4 KiB pages (TLB misses, prefetchers ramping up); in one arena of huge
    pages, in forward order, they stream at about 1.35x the rate (docs/benchmarks.md). Where
    madvise is missing or refused the arena still holds them in order. Each entry of packed is
    replaced by its view as it is copied, so a caller that passes the only references frees
    the originals one by one.
    """
    if not packed:
        return []
    dtype = packed[0].dtype
    assert all(p.dtype == dtype for p in packed), "one arena holds one dtype"
    total = sum(p.numel() for p in packed)
    item = packed[0].element_size()
    buffer = torch.empty(total + HUGE_PAGE // item, dtype=dtype)
    start = (-buffer.data_ptr()) % HUGE_PAGE // item
    _advise_huge_pages(buffer.data_ptr() + start * item, total * item)
    views, offset = [], start
    for i, p in enumerate(packed):
        view = buffer[offset : offset + p.numel()].view(p.shape)
        view.copy_(p)
        views.append(view)
        offset += p.numel()
        packed[i] = view  # the original goes now (when the list held its last reference): the
        del p  # arena's untouched pages cost nothing yet, so the peak stays near one copy
        release_freed_memory()
    return views


def _advise_huge_pages(address: int, size: int) -> None:
    """madvise(MADV_HUGEPAGE) over [address, address + size), before the pages are touched."""
    madvise(address, size, MADV_HUGEPAGE)  # a refusal only costs speed
