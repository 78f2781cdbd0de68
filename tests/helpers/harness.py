"""Driving a native LlamaModel by hand: block tables, ragged batches, and reference logits."""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from transformers import PreTrainedModel

from verispec.kv import BlockTable
from verispec.models.batch import SeqChunk
from verispec.models.llama import LlamaModel
from verispec.models.paged import PagedModel, append_chunk
from verispec.models.weights.loader import load_model

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

    def __init__(self, table: BlockTable) -> None:
        self.table = table

    def chunk(
        self,
        ids: list[int],
        num_logits: int = 1,
        extra_mask: torch.Tensor | None = None,
        positions: list[int] | None = None,
    ) -> SeqChunk:
        return append_chunk(self.table, ids, num_logits, extra_mask, positions)


class Runner(PagedModel):
    """A model with its own KV cache (block size 4 by default) for driving it by hand."""

    def __init__(self, model: LlamaModel, num_blocks: int = 64, block_size: int = 4) -> None:
        super().__init__(model, num_blocks, block_size)

    def sequence(self) -> Sequence:
        return Sequence(self.new_table())

    def prefill(self, ids: list[int], num_logits: int = 1) -> torch.Tensor:
        """Logits of the last num_logits tokens of a fresh sequence prefilled with ids."""
        return self.forward([self.sequence().chunk(ids, num_logits)])


def run_shapes(runner: Runner, vocab: int) -> list[torch.Tensor]:
    """Logits of every kind of forward the engine makes, on one runner, in a fixed order."""
    a, b = runner.sequence(), runner.sequence()
    out = [
        runner.forward([a.chunk(random_ids(30, vocab, 1))]),  # prefill past the window of 24
        runner.forward([a.chunk(random_ids(1, vocab, 2))]),  # decode
        runner.forward([a.chunk(random_ids(1, vocab, 3))]),  # decode, one key more
        runner.forward([a.chunk(random_ids(5, vocab, 4), num_logits=5)]),  # verify 1 + 4
        runner.forward([b.chunk(random_ids(7, vocab, 5)), a.chunk(random_ids(3, vocab, 6), 3)]),
    ]
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    out.append(runner.forward([a.chunk(random_ids(4, vocab, 7), 4, tree, [36, 37, 37, 38])]))
    out.append(runner.forward([b.chunk(random_ids(1, vocab, 8)), a.chunk(random_ids(1, vocab, 9))]))
    return out


def assert_runs_match(got: Runner, want: Runner, atol: float) -> None:
    """run_shapes on both runners gives the same logits and KV entries within atol."""
    vocab = want.model.config.vocab_size
    for i, (a, b) in enumerate(zip(run_shapes(got, vocab), run_shapes(want, vocab), strict=True)):
        torch.testing.assert_close(a, b, atol=atol, rtol=0, msg=f"forward {i}")
    slots = torch.arange(64 * 4)
    for a, b in zip(got.kv.read(slots), want.kv.read(slots), strict=True):
        torch.testing.assert_close(a, b, atol=atol, rtol=0)
