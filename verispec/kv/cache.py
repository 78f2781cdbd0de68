"""KVCache: the key and value tensors, addressed by flat slot (block * block_size + offset)."""

from __future__ import annotations

import functools

import torch


def token_bytes(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes one token's keys and values take over every layer.

    >>> token_bytes(30, 3, 64, torch.float32)  # SmolLM2-135M: 45 KiB a token
    46080
    """
    return 2 * num_layers * num_kv_heads * head_dim * dtype.itemsize


class KVCache:
    """Paged key/value storage for every layer of one model; bookkeeping lives in BlockTable.

    The tensors are committed when made: every byte is written (zeros), so the process holds
    the whole pool from the start and its resident memory does not grow as blocks are first
    used (a pool the OS backed page by page on first use crept up over hours of serving)."""

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (num_blocks * block_size, num_kv_heads, head_dim)
        device = torch.device(device)
        # One tensor per layer, not one stacked tensor: a compiled forward then writes each in
        # place (a write into a slice of a shared base would be traced as a copy of the base).
        # [slots, kv_heads, head_dim] each
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.nbytes = token_bytes(num_layers, num_kv_heads, head_dim, dtype) * shape[0]
        """Bytes of every layer's keys and values together."""

    @functools.cached_property
    def addresses(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Every layer's key and value tensor addresses (the native decoder stack reads and
        writes them in place; the tensors are never replaced)."""
        return tuple(k.data_ptr() for k in self.k), tuple(v.data_ptr() for v in self.v)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [T, kv_heads, head_dim] of the new tokens at slots [T] (index_put_, which
        torch.compile keeps in place on a graph input)."""
        self.k[layer].index_put_((slots,), k)
        self.v[layer].index_put_((slots,), v)

    def read(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer's keys and values at slots [n] -> [layers, n, kv_heads, head_dim] each
        (a copy, for inspection and tests)."""
        return (
            torch.stack([k.index_select(0, slots) for k in self.k]),
            torch.stack([v.index_select(0, slots) for v in self.v]),
        )

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values at slots [...] -> [..., kv_heads, head_dim] each."""
        flat = slots.reshape(-1)  # index_select: one memcpy per slot, ~5x faster than [slots]
        shape = (*slots.shape, *self.k[layer].shape[1:])
        return (
            self.k[layer].index_select(0, flat).view(shape),
            self.v[layer].index_select(0, flat).view(shape),
        )

    def window(self, layer: int, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of consecutive slots [start, stop), in place: [1, stop - start,
        kv_heads, head_dim] views each (what gather returns for one sequence, without a copy)."""
        return self.k[layer][start:stop][None], self.v[layer][start:stop][None]

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy every layer's keys and values from slots src [n] to slots dst [n] (all sources
        are read before any destination is written): moves an accepted tree path into place."""
        for cache in (*self.k, *self.v):
            cache.index_copy_(0, dst, cache.index_select(0, src))
