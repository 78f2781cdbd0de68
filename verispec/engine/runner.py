"""ModelRunner: turns a step's scheduled requests into one ragged forward and samples from it."""

from __future__ import annotations

import torch

from verispec.batch import ForwardBatch, SeqChunk
from verispec.engine.request import Request
from verispec.engine.scheduler import ScheduledRequest
from verispec.kv.cache import KVCache
from verispec.models.llama import LlamaModel
from verispec.sample import SamplingTensors, sample, warp


class ModelRunner:
    """Owns a model and its KV cache tensors; one execute() is one forward."""

    def __init__(self, model: LlamaModel, kv: KVCache, generator: torch.Generator) -> None:
        self.model = model
        self.kv = kv
        self.generator = generator
        """Shared generator for requests without a seed of their own."""

    def execute(self, scheduled: list[ScheduledRequest]) -> torch.Tensor:
        """One forward over every scheduled chunk; logits [num sampling requests, vocab]."""
        chunks = [
            SeqChunk(
                token_ids=s.token_ids,
                start_position=s.start,
                slots=s.slots,
                block_table=s.request.block_table.blocks,
                num_logits=1 if s.samples else 0,
            )
            for s in scheduled
        ]
        batch = ForwardBatch.build(chunks, self.kv.block_size, self.model.device)
        return self.model.forward(batch, self.kv)

    def sample(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        """Next token of each request from its logits row [vocab] (one host sync per step)."""
        if not requests:
            return []
        if all(r.params.greedy and not r.params.needs_penalties for r in requests):
            return logits.argmax(dim=-1).tolist()
        t = SamplingTensors.build(
            [r.params for r in requests],
            [r.prompt_token_ids for r in requests],
            [r.output_token_ids for r in requests],
            vocab_size=logits.shape[-1],
            device=logits.device,
        )
        probs = warp(logits, t)  # [n, vocab]
        tokens = sample(probs, [r.generator for r in requests], t.greedy, self.generator)
        return tokens.tolist()
