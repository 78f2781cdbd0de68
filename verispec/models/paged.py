"""PagedModel: a model with its own paged KV cache; the one place a ragged batch is built and run.

The engine's target, the draft model and the benchmarks all forward through it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from verispec.kv import BlockAllocator, BlockTable
from verispec.models.batch import ForwardBatch, SeqChunk
from verispec.models.llama import LlamaModel


class PagedModel:
    """A LlamaModel, its KV cache tensors and the allocator of their blocks."""

    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int) -> None:
        self.model = model
        self.block_size = block_size
        self.kv = model.new_kv_cache(num_blocks, block_size)
        self.allocator = BlockAllocator(num_blocks)

    def new_table(self) -> BlockTable:
        """An empty block table for one sequence in this cache."""
        return BlockTable(self.allocator, self.block_size)

    def forward(self, chunks: Sequence[SeqChunk]) -> torch.Tensor:
        """Logits [sum of num_logits, vocab] of one forward over every chunk."""
        return self.model.forward(self._batch(chunks), self.kv)

    def forward_with_features(
        self, chunks: Sequence[SeqChunk], feature_layers: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits as forward, and features [sum of new tokens, len(layers) * hidden] of every
        new token in chunk order (LlamaModel.hidden_states says which residual streams)."""
        return self.model.forward_with_features(self._batch(chunks), self.kv, feature_layers)

    def time_forward(self, num_tokens: int, runs: int) -> float:
        """Seconds of the fastest of `runs` forwards of num_tokens new tokens, after an untimed
        one (other work on the machine only ever adds time), in blocks freed afterwards."""
        table = self.new_table()
        try:
            chunk = append_chunk(table, [0] * num_tokens)
            self.forward([chunk])
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                self.forward([chunk])
                times.append(time.perf_counter() - start)
            return min(times)
        finally:
            table.free()

    def _batch(self, chunks: Sequence[SeqChunk]) -> ForwardBatch:
        return ForwardBatch.build(chunks, self.block_size, self.model.device)


def append_chunk(
    table: BlockTable,
    token_ids: Sequence[int],
    num_logits: int = 1,
    extra_mask: torch.Tensor | None = None,
    positions: list[int] | None = None,
) -> SeqChunk:
    """Reserve KV slots for token_ids after what `table` holds and describe them as a chunk."""
    start = table.num_tokens
    slots = table.append_slots(len(token_ids))
    return SeqChunk(list(token_ids), start, slots, list(table.blocks), num_logits, extra_mask,
                    positions)  # fmt: skip
