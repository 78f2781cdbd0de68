"""Paged attention over a ragged batch: gather each sequence's keys from its blocks, mask, SDPA."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from verispec.models.batch import ForwardBatch

if TYPE_CHECKING:
    from verispec.kv.cache import KVCache

LONG_QUERY = 32
"""A sequence with more new tokens than this (a prefill chunk) attends in a group of its own. In
one padded batch every short sequence (a decode or verify step) would be padded to the chunk's
length: 15 two-token verify steps beside one 152-token chunk took 1.0 s on SmolLM2, against
0.46 s for the two forwards apart (docs/design.md, 5)."""


def attention_groups(query_lens: Sequence[int], long_query: int = LONG_QUERY) -> list[list[int]]:
    """Which sequences attend together in one padded batch: the short ones (decode and verify
    steps) in one group, each long one (a prefill chunk) alone.

    >>> attention_groups([2, 2, 152, 1, 40])
    [[0, 1, 3], [2], [4]]
    >>> attention_groups([2, 1])
    [[0, 1]]
    """
    short = [s for s, q in enumerate(query_lens) if q <= long_query]
    return ([short] if short else []) + [[s] for s, q in enumerate(query_lens) if q > long_query]


@dataclass(slots=True)
class AttentionLayout:
    """Gather indices and masks shared by every layer of one forward (built once per forward)."""

    q_rows: torch.Tensor | None  # [S, max_q] flat row of each query slot; None when S == 1
    q_valid: torch.Tensor | None  # [S, max_q] bool, False on padding; None when S == 1
    kv_slots: torch.Tensor | None  # [S, max_ctx] KV slot of each key; None: read in place
    kv_range: tuple[int, int] | None  # the one sequence's keys are slots [start, stop)
    masks: dict[int | None, torch.Tensor | None]
    """Per sliding window (None = full): [S, 1, max_q, max_ctx] bool, True = attend; None when
    every query sees every key."""
    row_keys: dict[int | None, list[tuple[int, slice | torch.Tensor]]] | None
    """Batch-invariant mode only: per window, each flat row's (sequence, visible key indices)."""
    groups: list[tuple[torch.Tensor, AttentionLayout]] = field(default_factory=list)
    """When sequences attend in groups (attention_groups): each group's flat rows [T'] and its
    own layout; the fields above are then unused."""

    def tensors(self) -> list[torch.Tensor | None]:
        """The per-step tensors of the layout (None where absent)."""
        return [self.q_rows, self.q_valid, self.kv_slots, *self.masks.values()]

    @classmethod
    def build(
        cls,
        batch: ForwardBatch,
        windows: set[int | None],
        row_wise: bool = False,
        grouped: bool = True,
    ) -> AttentionLayout:
        """Index maps from the batch's block tables, and one mask per distinct sliding window;
        grouped: long chunks attend apart from the rest (attention_groups), which a compiled
        graph does not do (the number of groups would be part of its shape)."""
        if grouped and not row_wise and batch.num_seqs > 1:
            groups = attention_groups(batch.query_lens)
            if len(groups) > 1:
                parts = [(rows, cls.build(sub, windows, grouped=False))
                         for sub, rows in (batch.select(seqs) for seqs in groups)]  # fmt: skip
                return cls(None, None, None, None, {}, None, parts)
        device = batch.input_ids.device
        num_seqs, max_q, max_ctx = (
            batch.num_seqs,
            max(batch.query_lens),
            max(batch.context_lens_host),
        )
        kv_slots, kv_range = None, None
        if batch.kv_start is not None:
            kv_range = (batch.kv_start, batch.kv_start + max_ctx)
        else:
            key = torch.arange(max_ctx, device=device)  # [C]
            bs = batch.block_size
            kv_slots = batch.block_tables[:, key // bs] * bs + key % bs  # [S, C]
        q_rows = q_valid = None
        if num_seqs > 1:
            offs = torch.arange(max_q, device=device)[None, :]  # [1, Q]
            q_lens = batch.cu_query_lens[1:] - batch.cu_query_lens[:-1]  # [S]
            q_valid = offs < q_lens[:, None]
            q_rows = torch.where(q_valid, batch.cu_query_lens[:-1, None] + offs, 0)
        masks = {w: _mask(batch, w, max_q, max_ctx) for w in windows}
        row_keys = {w: _row_keys(batch, w, masks[w]) for w in windows} if row_wise else None
        return cls(q_rows, q_valid, kv_slots, kv_range, masks, row_keys)


def _mask(batch: ForwardBatch, window: int | None, max_q: int, max_ctx: int) -> torch.Tensor | None:
    """Which keys each query sees: causal in cache order, the extra (tree) mask among new tokens,
    the sliding window; None when every query may see every key (a lone decode token)."""
    binding_window = window is not None and max_ctx > window
    if batch.num_seqs == 1 and max_q == 1 and batch.extra_mask is None and not binding_window:
        return None
    device = batch.input_ids.device
    ctx = batch.context_lens[:, None, None]  # [S, 1, 1]
    q_lens = (batch.cu_query_lens[1:] - batch.cu_query_lens[:-1])[:, None, None]  # [S, 1, 1]
    i = torch.arange(max_q, device=device)[None, :, None]  # [1, Q, 1]
    j = torch.arange(max_ctx, device=device)[None, None, :]  # [1, 1, C]
    first_new = ctx - q_lens  # key index of the first new token
    own = first_new + i  # key index of query i itself
    visible = j <= own  # [S, Q, C]
    if batch.extra_mask is not None:  # right-aligned: its last column is each sequence's last key
        width = batch.extra_mask.shape[2]
        rel = (j - (ctx - width)).expand(-1, max_q, -1)  # [S, Q, C] column of key j
        masked = batch.extra_mask.gather(2, rel.clamp(0, width - 1))
        visible &= (rel < 0) | masked
    if binding_window:
        q_pos, k_pos = _rotary_positions(batch, max_q, max_ctx)
        visible &= (q_pos - k_pos) < window
    # Padding queries see key 0 only, so softmax stays finite; their rows are dropped.
    visible = torch.where(i < q_lens, visible, j == 0)
    return visible[:, None]  # [S, 1, Q, C]


def _rotary_positions(
    batch: ForwardBatch, max_q: int, max_ctx: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary positions of queries [S, Q, 1] and keys [S, 1, C], which the sliding window
    measures: a cached key's is its index; a new token's is its own (tree siblings share one,
    so its cache index can run ahead of it). Padding rows and keys get clamped, unused values."""
    device = batch.input_ids.device
    last_row = batch.num_tokens - 1
    q_lens = batch.cu_query_lens[1:] - batch.cu_query_lens[:-1]  # [S]
    first_new = (batch.context_lens - q_lens)[:, None]  # [S, 1] key index of first new token
    starts = batch.cu_query_lens[:-1, None]  # [S, 1] flat row of first new token
    i = torch.arange(max_q, device=device)[None, :]  # [1, Q]
    j = torch.arange(max_ctx, device=device)[None, :]  # [1, C]
    q_pos = batch.positions[(starts + i).clamp(max=last_row)]  # [S, Q]
    new_key_pos = batch.positions[(starts + j - first_new).clamp(0, last_row)]  # [S, C]
    k_pos = torch.where(j < first_new, j, new_key_pos)  # [S, C]
    return q_pos[:, :, None], k_pos[:, None, :]


def _row_keys(
    batch: ForwardBatch, window: int | None, mask: torch.Tensor | None
) -> list[tuple[int, slice | torch.Tensor]]:
    """For each flat row, its sequence and the keys it sees: a slice [lo, own + 1) in the
    usual causal case, exactly as a lone decode step of that token would see them."""
    rows: list[tuple[int, slice | torch.Tensor]] = []
    for s, (q, ctx) in enumerate(zip(batch.query_lens, batch.context_lens_host, strict=True)):
        for i in range(q):
            own = ctx - q + i
            if batch.extra_mask is not None and mask is not None:
                rows.append((s, mask[s, 0, i].nonzero().flatten()))
            else:
                lo = max(0, own + 1 - window) if window is not None else 0
                rows.append((s, slice(lo, own + 1)))
    return rows


def attend(
    q: torch.Tensor,
    kv: KVCache,
    layer: int,
    layout: AttentionLayout,
    window: int | None,
    scale: float,
) -> torch.Tensor:
    """q [T, H, D] -> [T, H * D]: each group of sequences reads its keys and values of `layer`
    from the paged cache and attends over them."""
    if layout.groups:
        num_tokens, num_heads, head_dim = q.shape
        out = q.new_empty(num_tokens, num_heads * head_dim)  # [T, H * D]
        for rows, part in layout.groups:
            out.index_copy_(0, rows, attend(q.index_select(0, rows), kv, layer, part, window,
                                            scale))  # fmt: skip
        return out
    if layout.kv_range is not None:  # one sequence in consecutive blocks: no copy
        keys, values = kv.window(layer, *layout.kv_range)  # [1, C, KVH, D] each
    else:
        keys, values = kv.gather(layer, layout.kv_slots)  # [S, C, KVH, D] each
    return paged_attention(q, keys, values, layout, window, scale)


def paged_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    layout: AttentionLayout,
    window: int | None,
    scale: float,
) -> torch.Tensor:
    """q [T, H, D], keys/values [S, C, KVH, D] -> [T, H * D]."""
    num_tokens, num_heads, head_dim = q.shape
    if layout.row_keys is not None:
        return _row_wise_attention(q, keys, values, layout.row_keys[window], scale)
    qs = q.unsqueeze(0) if layout.q_rows is None else q[layout.q_rows]  # [S, Q, H, D]
    out = F.scaled_dot_product_attention(
        qs.transpose(1, 2),
        keys.transpose(1, 2),
        values.transpose(1, 2),
        attn_mask=layout.masks[window],
        scale=scale,
        enable_gqa=bool(num_heads != keys.shape[2]),  # a Python bool even if traced
    ).transpose(1, 2)  # [S, Q, H, D]
    out = out[0] if layout.q_valid is None else out[layout.q_valid]  # [T, H, D]
    return out.reshape(num_tokens, num_heads * head_dim)


def _row_wise_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    rows: list[tuple[int, slice | torch.Tensor]],
    scale: float,
) -> torch.Tensor:
    """Batch-invariant attention: one unmasked SDPA call per query row over its visible keys."""
    num_tokens, num_heads, head_dim = q.shape
    out = torch.empty_like(q)  # [T, H, D]
    for t, (s, sel) in enumerate(rows):
        k, v = keys[s, sel].transpose(0, 1), values[s, sel].transpose(0, 1)  # [KVH, c, D]
        out[t] = F.scaled_dot_product_attention(
            q[t][:, None, :], k, v, scale=scale, enable_gqa=num_heads != k.shape[0]
        )[:, 0, :]
    return out.reshape(num_tokens, num_heads * head_dim)
