"""KVCache: slot addressing and copies between slots."""

from __future__ import annotations

import ctypes
import os
import sys

import pytest
import torch

from verispec.kv.cache import KVCache


def test_copy_slots_reads_every_source_before_writing() -> None:
    """Moving slots [3, 5] to [2, 3] keeps slot 3's old value for slot 2 in every layer."""
    kv = KVCache(num_layers=2, num_blocks=2, block_size=4, num_kv_heads=1, head_dim=2)
    for k, v in zip(kv.k, kv.v, strict=True):
        k[:] = torch.arange(8, dtype=torch.float32)[:, None, None]
        v[:] = -k
    kv.copy_slots(torch.tensor([3, 5]), torch.tensor([2, 3]))
    for layer in range(2):
        assert kv.k[layer][:, 0, 0].tolist() == [0, 1, 3, 5, 4, 5, 6, 7]
        assert kv.v[layer][:, 0, 1].tolist() == [-0.0, -1, -3, -5, -4, -5, -6, -7]


def resident_pages(tensor: torch.Tensor) -> tuple[int, int]:
    """(resident, all) pages of the memory under tensor, from Linux's mincore."""
    libc = ctypes.CDLL(None, use_errno=True)
    page = os.sysconf("SC_PAGE_SIZE")
    start = tensor.data_ptr() // page * page
    end = -(-(tensor.data_ptr() + tensor.numel() * tensor.element_size()) // page) * page
    pages = (end - start) // page
    vec = (ctypes.c_ubyte * pages)()
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(start, end - start, vec) == 0, os.strerror(ctypes.get_errno())
    return sum(b & 1 for b in vec), pages


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore is Linux's")
def test_the_pool_is_resident_from_the_start() -> None:
    """Every page of every layer's keys and values is backed when the cache is made, so the
    process's resident memory does not grow as blocks are first used under load."""
    kv = KVCache(num_layers=2, num_blocks=256, block_size=16, num_kv_heads=4, head_dim=64)
    assert kv.nbytes == 2 * 2 * 256 * 16 * 4 * 64 * 4  # 8 MiB
    for tensor in (*kv.k, *kv.v):
        resident, pages = resident_pages(tensor)
        assert resident == pages
