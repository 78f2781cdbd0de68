"""Draft-model proposer: a small model of the same family drafts k tokens autoregressively."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from verispec.batch import ForwardBatch, SeqChunk
from verispec.config import EngineConfig, SpecConfig
from verispec.drafters.proposer import Drafts, TargetInfo
from verispec.kv import BlockAllocator, BlockTable
from verispec.models.loader import load_model, resolve_model_path
from verispec.request import Request
from verispec.sample import SamplingTensors, sample, warp
from verispec.tokenizer import Tokenizer


@dataclass(slots=True)
class _DraftState:
    """What the draft model's KV cache holds for one request."""

    table: BlockTable
    base: list[int] = field(default_factory=list)
    """Tokens of the request the cache held when the last drafts were made."""
    drafts: list[int] = field(default_factory=list)
    """Draft tokens whose KV the cache also holds, after base."""

    def valid_length(self, tokens: list[int]) -> int:
        """Cached positions still valid for tokens: the common prefix of base + drafts."""
        n = len(self.base)
        for d in self.drafts:
            if n >= len(tokens) or tokens[n] != d:
                break
            n += 1
        return min(n, len(tokens))


class DraftModelProposer:
    """Runs a draft model in lockstep with the target: its own paged KV cache, rolled back to
    the accepted prefix before each proposal; drafts use the request's own sampling warping."""

    def __init__(self, spec: SpecConfig, config: EngineConfig, target: TargetInfo) -> None:
        path = resolve_model_path(spec.model or "")
        self.model = load_model(
            path, target.dtype, target.device, config.linear_backend,
            batch_invariant=config.batch_invariant, quantization=spec.quantization,
        )  # fmt: skip
        check_vocabularies(target.tokenizer, Tokenizer(path))
        self.target = target
        self.block_size = config.cache.block_size
        # Headroom beyond the target's blocks: a request may still hold up to k - 1 stale draft
        # slots (not yet rolled back) when it is not drafting this step.
        stale = math.ceil(spec.num_speculative_tokens / self.block_size) + 1
        num_blocks = target.num_blocks + config.max_num_seqs * stale
        self.allocator = BlockAllocator(num_blocks)
        self.kv = self.model.new_kv_cache(num_blocks, self.block_size)
        self.max_len = self.model.config.max_position_embeddings
        self.states: dict[str, _DraftState] = {}

    def propose(self, requests: Sequence[Request], num_tokens: Sequence[int]) -> Drafts:
        """k_i tokens per request: the first forward catches the draft cache up with the tokens
        accepted since last time, then one batched forward per further draft position."""
        ks = [
            min(k, self.max_len - r.num_tokens) for r, k in zip(requests, num_tokens, strict=True)
        ]
        drafts: list[list[int]] = [[] for _ in requests]
        probs: list[list[torch.Tensor | None]] = [[] for _ in requests]  # None: one-hot q
        for step in range(max(ks, default=0)):
            active = [i for i, k in enumerate(ks) if k > step]
            logits = self._forward([requests[i] for i in active], [drafts[i] for i in active])
            q, tokens = self._sample(
                logits, [requests[i] for i in active], [drafts[i] for i in active]
            )
            for row, i in enumerate(active):
                drafts[i].append(tokens[row])
                probs[i].append(None if q is None else q[row])
        for r, d in zip(requests, drafts, strict=True):
            if d:
                state = self.states[r.request_id]
                state.base, state.drafts = r.all_token_ids, d[:-1]
        return Drafts(token_ids=drafts, probs=self._stack_q(drafts, probs))

    def _stack_q(
        self, drafts: list[list[int]], probs: list[list[torch.Tensor | None]]
    ) -> torch.Tensor | None:
        """[total drafts, vocab] q rows in request order, or None when every row is one-hot."""
        flat = [
            (d, p)
            for ds, ps in zip(drafts, probs, strict=True)
            for d, p in zip(ds, ps, strict=True)
        ]
        if all(p is None for _, p in flat):
            return None
        vocab = self.target.vocab_size
        one_hot = torch.zeros(vocab, device=self.model.device)
        return torch.stack(
            [
                p
                if p is not None
                else one_hot.index_fill(0, torch.tensor(d, device=one_hot.device), 1.0)
                for d, p in flat
            ]
        )

    def _sample(
        self, logits: torch.Tensor, requests: list[Request], drafts: list[list[int]]
    ) -> tuple[torch.Tensor | None, list[int]]:
        """q [n, target vocab] after the request's own warping, and one draft token per row;
        q is None when every row is greedy (one-hot at the argmax, which verify implies)."""
        logits = _match_vocab(logits, self.target.vocab_size)
        if all(r.params.greedy and not r.params.needs_penalties for r in requests):
            return None, logits.argmax(dim=1).tolist()
        t = SamplingTensors.build(
            [r.params for r in requests],
            [r.prompt_token_ids for r in requests],
            [r.output_token_ids + d for r, d in zip(requests, drafts, strict=True)],
            self.target.vocab_size,
            logits.device,
        )
        q = warp(logits, t)  # [n, vocab]
        tokens = sample(q, [r.generator for r in requests], t.greedy, self.target.generator)
        return q, tokens.tolist()

    def release(self, request: Request) -> None:
        """Free the draft KV blocks of a finished or preempted request."""
        state = self.states.pop(request.request_id, None)
        if state is not None:
            state.table.free()

    def _forward(self, requests: list[Request], drafts: list[list[int]]) -> torch.Tensor:
        """One draft forward: for each request the tokens its draft cache lacks; logits [n, V]."""
        chunks = []
        for r, d in zip(requests, drafts, strict=True):
            state = self.states.get(r.request_id)
            if state is None:
                state = self.states[r.request_id] = _DraftState(
                    BlockTable(self.allocator, self.block_size)
                )
            tokens = r.all_token_ids + d
            if not d:  # first draft step: roll back to what is still valid (keep >= 1 to feed)
                state.table.truncate(min(state.valid_length(tokens), len(tokens) - 1))
            start = state.table.num_tokens
            new = tokens[start:]
            slots = state.table.append_slots(len(new))
            chunks.append(SeqChunk(new, start, slots, state.table.blocks))
        batch = ForwardBatch.build(chunks, self.block_size, self.model.device)
        return self.model.forward(batch, self.kv)


def _match_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Draft logits over the target's ids: extra padding rows dropped, missing ones -inf."""
    n, v = logits.shape
    if v >= vocab_size:
        return logits[:, :vocab_size]
    pad = torch.full((n, vocab_size - v), float("-inf"), dtype=logits.dtype, device=logits.device)
    return torch.cat([logits, pad], dim=1)


def check_vocabularies(target: Tokenizer, draft: Tokenizer) -> None:
    """Target and draft must give every token the same id; ValueError names the first that
    differs. Model vocabularies may still differ by padding rows (e.g. 151936 vs 152064)."""
    t_vocab, d_vocab = target.hf.get_vocab(), draft.hf.get_vocab()
    if t_vocab == d_vocab:
        return
    t_by_id = {i: tok for tok, i in t_vocab.items()}
    d_by_id = {i: tok for tok, i in d_vocab.items()}
    for i in range(max(len(t_by_id), len(d_by_id))):
        if t_by_id.get(i) != d_by_id.get(i):
            raise ValueError(
                f"the draft's tokenizer differs from the target's at id {i}: target "
                f"{t_by_id.get(i)!r}, draft {d_by_id.get(i)!r}; a draft must share the target's "
                "vocabulary (only padding rows at the end of the embedding may differ)"
            )
    raise ValueError("the draft's tokenizer maps tokens to ids differently from the target's")
