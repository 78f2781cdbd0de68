"""ModelRunner: turns a step's scheduled requests into one ragged forward and verifies it."""

from __future__ import annotations

import torch

from verispec.batch import ForwardBatch, SeqChunk
from verispec.engine.scheduler import ScheduledRequest
from verispec.kv.cache import KVCache
from verispec.models.llama import LlamaModel
from verispec.sample import SamplingTensors
from verispec.sample.rejection import Verdict, verify


class ModelRunner:
    """Owns a model and its KV cache tensors; one execute() is one forward."""

    def __init__(self, model: LlamaModel, kv: KVCache, generator: torch.Generator) -> None:
        self.model = model
        self.kv = kv
        self.generator = generator
        """Shared generator for requests without a seed of their own."""

    def execute(self, scheduled: list[ScheduledRequest]) -> torch.Tensor:
        """One forward over every scheduled chunk and its drafts; logits [R, vocab] with
        1 + len(drafts) rows per request that samples this step, in scheduled order."""
        chunks = []
        for s in scheduled:
            tokens = s.token_ids + s.draft_token_ids
            chunks.append(
                SeqChunk(
                    token_ids=tokens,
                    start_position=s.start,
                    slots=s.slots[: len(tokens)],
                    block_table=s.request.block_table.blocks,
                    num_logits=1 + len(s.draft_token_ids) if s.samples else 0,
                )
            )
        batch = ForwardBatch.build(chunks, self.kv.block_size, self.model.device)
        return self.model.forward(batch, self.kv)

    def verify(
        self,
        logits: torch.Tensor,
        sampling: list[ScheduledRequest],
        draft_probs: torch.Tensor | None,
    ) -> Verdict:
        """Accepted drafts plus one recovered/bonus token per sampling request (with no drafts
        that is plain sampling). Row j of a request is warped with its drafts[:j] as history."""
        params, prompts, outputs = [], [], []
        for s in sampling:
            r = s.request
            for j in range(len(s.draft_token_ids) + 1):
                params.append(r.params)
                prompts.append(r.prompt_token_ids)
                # Histories only matter for penalties; skip the per-row copy otherwise.
                penalised = r.params.needs_penalties and j > 0
                outputs.append(r.output_token_ids + s.draft_token_ids[:j] if penalised
                               else r.output_token_ids)  # fmt: skip
        t = SamplingTensors.build(params, prompts, outputs, logits.shape[-1], logits.device)
        return verify(
            logits,
            [s.draft_token_ids for s in sampling],
            draft_probs,
            t,
            [s.request.generator for s in sampling],
            self.generator,
        )
