"""ModelRunner: turns a step's scheduled requests into one ragged forward and verifies it."""

from __future__ import annotations

import torch

from verispec.batch import SeqChunk
from verispec.engine.scheduler import ScheduledRequest
from verispec.models.paged import PagedModel
from verispec.request import sampling_tensors
from verispec.sample.rejection import Verdict, verify


class ModelRunner:
    """Owns the target and its paged KV cache; one execute() is one forward."""

    def __init__(self, target: PagedModel, generator: torch.Generator) -> None:
        self.target = target
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
        return self.target.forward(chunks)

    def verify(
        self,
        logits: torch.Tensor,
        sampling: list[ScheduledRequest],
        draft_probs: torch.Tensor | None,
    ) -> Verdict:
        """Accepted drafts plus one recovered/bonus token per sampling request (with no drafts
        that is plain sampling). Row j of a request is warped with its drafts[:j] as history."""
        rows = [
            (s.request, s.draft_token_ids[:j])
            for s in sampling
            for j in range(len(s.draft_token_ids) + 1)
        ]
        t = sampling_tensors(rows, logits.shape[-1], logits.device)
        return verify(
            logits,
            [s.draft_token_ids for s in sampling],
            draft_probs,
            t,
            [s.request.generator for s in sampling],
            self.generator,
        )
