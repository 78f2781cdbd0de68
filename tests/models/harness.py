"""Driving a native LlamaModel by hand: block tables, ragged batches, and reference logits."""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from transformers import PreTrainedModel

from verispec.batch import ForwardBatch, SeqChunk
from verispec.kv import BlockAllocator, BlockTable
from verispec.models.llama import LlamaModel
from verispec.models.loader import load_model

BACKENDS = ("torch", "onednn", "fp16")


@functools.cache
def native_model(path: Path, backend: str = "torch") -> LlamaModel:
    """The checkpoint at path as a float32 CPU LlamaModel (loaded once per path and backend)."""
    return load_model(path, torch.float32, torch.device("cpu"), backend)


def random_ids(n: int, vocab_size: int, seed: int) -> list[int]:
    """n token ids, avoiding the special ids 0-2."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (n,), generator=g).tolist()


def hf_logits(hf_model: PreTrainedModel, ids: list[int]) -> torch.Tensor:
    """transformers' logits [len(ids), vocab] for one full sequence."""
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float()


class Sequence:
    """One sequence's block table; chunk() reserves KV slots for its next tokens."""

    def __init__(self, allocator: BlockAllocator, block_size: int) -> None:
        self.table = BlockTable(allocator, block_size)

    def chunk(
        self,
        ids: list[int],
        num_logits: int = 1,
        extra_mask: torch.Tensor | None = None,
        positions: list[int] | None = None,
    ) -> SeqChunk:
        start = self.table.num_tokens
        slots = self.table.append_slots(len(ids))
        return SeqChunk(
            list(ids), start, slots, list(self.table.blocks), num_logits, extra_mask, positions
        )


class Runner:
    """A model with its own KV cache and allocator; forward() runs one ragged batch."""

    def __init__(self, model: LlamaModel, num_blocks: int = 64, block_size: int = 4) -> None:
        self.model = model
        self.block_size = block_size
        self.kv = model.new_kv_cache(num_blocks, block_size)
        self.allocator = BlockAllocator(num_blocks)

    def sequence(self) -> Sequence:
        return Sequence(self.allocator, self.block_size)

    def forward(self, chunks: list[SeqChunk]) -> torch.Tensor:
        """Logits [sum of num_logits, vocab] of one forward over chunks."""
        return self.model.forward(ForwardBatch.build(chunks, self.block_size), self.kv)

    def prefill(self, ids: list[int], num_logits: int = 1) -> torch.Tensor:
        """Logits of the last num_logits tokens of a fresh sequence prefilled with ids."""
        return self.forward([self.sequence().chunk(ids, num_logits)])
