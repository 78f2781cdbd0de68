"""KVCache: slot addressing and copies between slots."""

from __future__ import annotations

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
