"""ForwardBatch: one ragged batch for one model forward, as flat tensors plus offsets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch


@dataclass(slots=True)
class SeqChunk:
    """What one sequence contributes to a forward: its new tokens and where their KV goes."""

    token_ids: list[int]
    """New tokens this step: a prefill chunk, 1 decode token, or 1 + k verify tokens."""
    start_position: int
    """Number of tokens already in this sequence's KV cache (the first new token's position)."""
    slots: list[int]
    """KV slot of each new token (from its BlockTable)."""
    block_table: list[int]
    """Blocks of the whole sequence, in order."""
    num_logits: int = 1
    """Logits wanted for the last num_logits new tokens (0 for a non-final prefill chunk)."""
    extra_mask: torch.Tensor | None = None
    """[q, w] bool, w >= q, True = may attend: which of the last w keys (the w - q cached just
    before the new tokens, then the q new ones) each new token sees, for a draft tree;
    None = causal. Keys before those w are always visible."""
    positions: list[int] | None = None
    """Rotary positions of the new tokens; None = start_position + 0, 1, 2, ..."""


@dataclass(slots=True)
class ForwardBatch:
    """Several sequences in one forward.

    Sequence s owns the flat rows from cu_query_lens[s] up to cu_query_lens[s + 1].
    """

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64, rotary positions
    slot_mapping: torch.Tensor  # [T] int64, KV slot each new token writes
    cu_query_lens: torch.Tensor  # [S + 1] int64, offsets of each sequence's rows
    context_lens: torch.Tensor  # [S] int64, KV length after this step's tokens are written
    block_tables: torch.Tensor  # [S, max_blocks] int64, padded with 0
    logits_indices: torch.Tensor  # [L] int64, flat rows whose logits are computed
    extra_mask: torch.Tensor | None  # [S, max_q, max_q] bool among new tokens, or None
    query_lens: list[int]  # host copy of the per-sequence new-token counts
    context_lens_host: list[int]  # host copy of context_lens (shapes without a device sync)
    block_size: int
    kv_start: int | None = None
    """First KV slot when the batch is one sequence whose blocks are consecutive: its keys are
    then slots kv_start, kv_start + 1, ... and attention reads them in place (no gather)."""

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, seqs: Sequence[int]) -> tuple[ForwardBatch, torch.Tensor]:
        """The sub-batch of sequences `seqs` (in that order), and its rows' flat indices in this
        batch [T']; the sub-batch computes no logits. E.g. query lens [2, 5, 1], seqs [0, 2]:
        rows [0, 1, 7]."""
        starts = list(accumulate(self.query_lens, initial=0))
        flat = [r for s in seqs for r in range(starts[s], starts[s + 1])]
        device = self.input_ids.device
        rows = torch.tensor(flat, dtype=torch.int64, device=device)  # [T']
        index = torch.tensor(list(seqs), dtype=torch.int64, device=device)  # [S']
        query_lens = [self.query_lens[s] for s in seqs]
        cu = list(accumulate(query_lens, initial=0))
        extra = None
        if self.extra_mask is not None:
            extra = self.extra_mask.index_select(0, index)[:, : max(query_lens)]
        sub = ForwardBatch(
            input_ids=self.input_ids.index_select(0, rows),
            positions=self.positions.index_select(0, rows),
            slot_mapping=self.slot_mapping.index_select(0, rows),
            cu_query_lens=torch.tensor(cu, dtype=torch.int64, device=device),
            context_lens=self.context_lens.index_select(0, index),
            block_tables=self.block_tables.index_select(0, index),
            logits_indices=rows[:0],
            extra_mask=extra,
            query_lens=query_lens,
            context_lens_host=[self.context_lens_host[s] for s in seqs],
            block_size=self.block_size,
        )
        return sub, rows

    @classmethod
    def build(
        cls, chunks: Sequence[SeqChunk], block_size: int, device: torch.device | str = "cpu"
    ) -> ForwardBatch:
        """Flatten per-sequence chunks into one batch (host work, then one copy per tensor)."""
        if not chunks:
            raise ValueError("a forward batch needs at least one sequence")
        query_lens = [len(c.token_ids) for c in chunks]
        if min(query_lens) < 1:
            raise ValueError("every sequence in a batch needs at least one new token")
        context_lens = [c.start_position + q for c, q in zip(chunks, query_lens, strict=True)]
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logits_rows: list[int] = []
        cu = [0]
        for c, q in zip(chunks, query_lens, strict=True):
            _check_chunk(c, q)
            ids += c.token_ids
            positions += c.positions or range(c.start_position, c.start_position + q)
            slots += c.slots
            logits_rows += range(cu[-1] + q - c.num_logits, cu[-1] + q)
            cu.append(cu[-1] + q)
        max_blocks = max(len(c.block_table) for c in chunks)
        tables = [
            b for c in chunks for b in c.block_table + [0] * (max_blocks - len(c.block_table))
        ]  # [S * max_blocks], padded with 0
        # One host-to-tensor copy for all seven index tensors (each call costs ~10 us, a
        # sizable part of a small model's decode step); the fields are views of it.
        parts = (ids, positions, slots, cu, context_lens, tables, logits_rows)
        flat = torch.tensor([v for part in parts for v in part], dtype=torch.int64, device=device)
        fields = flat.split([len(part) for part in parts])
        return cls(
            input_ids=fields[0],
            positions=fields[1],
            slot_mapping=fields[2],
            cu_query_lens=fields[3],
            context_lens=fields[4],
            block_tables=fields[5].view(len(chunks), max_blocks),
            logits_indices=fields[6],
            extra_mask=_stack_masks(chunks, max(query_lens), device),
            query_lens=query_lens,
            context_lens_host=context_lens,
            block_size=block_size,
            kv_start=_consecutive_start(chunks, context_lens, block_size),
        )


def _consecutive_start(
    chunks: Sequence[SeqChunk], context_lens: list[int], block_size: int
) -> int | None:
    """chunks[0]'s first slot if it is the only sequence and the blocks holding its context are
    consecutive ids (e.g. [4, 5, 6] -> 64 with block_size 16), else None."""
    if len(chunks) != 1:
        return None
    used = chunks[0].block_table[: -(-context_lens[0] // block_size)]
    first = used[0]
    return first * block_size if used == list(range(first, first + len(used))) else None


def _check_chunk(c: SeqChunk, q: int) -> None:
    """Per-sequence lengths must agree, or rows would silently shift into a neighbour's."""
    if len(c.slots) != q:
        raise ValueError(
            f"each new token needs exactly one KV slot: {q} tokens, {len(c.slots)} slots"
        )
    if not 0 <= c.num_logits <= q:
        raise ValueError(f"num_logits must be in [0, {q}] (the new tokens), got {c.num_logits}")
    if c.positions is not None and len(c.positions) != q:
        raise ValueError(f"positions must give one per new token ({q}), got {len(c.positions)}")


def _stack_masks(
    chunks: Sequence[SeqChunk], max_q: int, device: torch.device | str
) -> torch.Tensor | None:
    """[S, max_q, max_w] extra masks, right-aligned so that the last column is every sequence's
    last key (causal among the new tokens where a sequence has none; True to the left)."""
    if all(c.extra_mask is None for c in chunks):
        return None
    widths = [max_q if c.extra_mask is None else c.extra_mask.shape[-1] for c in chunks]
    max_w = max(widths)
    out = torch.ones(len(chunks), max_q, max_w, dtype=torch.bool)
    for s, (c, w) in enumerate(zip(chunks, widths, strict=True)):
        q = len(c.token_ids)
        if c.extra_mask is None:
            out[s, :q, max_w - q :] = torch.tril(torch.ones(q, q, dtype=torch.bool))
            continue
        shape_ok = c.extra_mask.dim() == 2 and c.extra_mask.shape[0] == q
        if not shape_ok or not q <= w <= c.start_position + q:
            raise ValueError(
                f"extra_mask must be [{q}, w] with {q} <= w <= {c.start_position + q} (the new "
                f"tokens and up to all cached keys), got {tuple(c.extra_mask.shape)}"
            )
        out[s, :q, max_w - w :] = c.extra_mask.to(torch.bool).cpu()
    return out.to(device)
