"""The Proposer protocol: what every drafter gives the engine, and Drafts, what it returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from verispec.engine.request import Request, all_greedy, noise_key, sampling_tensors
from verispec.kv.cache import KVCache
from verispec.models.llama import LlamaModel
from verispec.sample import argmax_rows, sample, warp
from verispec.sample.tree import DraftTree
from verispec.tokenizer import Tokenizer


@dataclass(slots=True)
class TargetInfo:
    """What a drafter needs to know about the target it drafts for."""

    tokenizer: Tokenizer
    vocab_size: int
    """Rows of the target's logits; draft distributions q are given over the same ids."""
    device: torch.device
    dtype: torch.dtype
    max_model_len: int
    num_blocks: int
    """KV blocks the target has; a draft model gets as many, plus headroom."""
    generator: torch.Generator
    """The engine's shared generator for requests without a seed."""
    block_size: int
    """Tokens per KV block (a drafter's own cache uses the same geometry)."""
    max_num_seqs: int
    linear_backend: str
    """Kernel choice for linear layers, as EngineConfig.linear_backend."""
    batch_invariant: bool
    compile: bool
    """Compile a draft model's decoder stack too (EngineConfig.compile)."""
    model: LlamaModel
    """The target itself (feature-level heads share its embedding and read its layers)."""


@dataclass(slots=True)
class Drafts:
    """Draft tokens for the requests of one step, in request order."""

    token_ids: list[list[int]]
    """Per request: up to its k draft tokens (possibly none)."""
    probs: torch.Tensor | None
    """[total drafts, vocab] the drafter's warped distribution q at each draft position, rows in
    request order; None for a deterministic drafter (q is one-hot at the draft token)."""
    trees: list[DraftTree] | None = None
    """Per request: the tree its token_ids form (nodes in that order, deterministic drafts);
    None when every request's drafts are a chain."""


class Proposer(Protocol):
    """A drafter: guesses up to k tokens for each request; the verifier keeps what is right."""

    def propose(self, requests: Sequence[Request], num_tokens: Sequence[int]) -> Drafts:
        """Draft up to num_tokens[i] tokens continuing requests[i].all_token_ids."""
        ...

    def release(self, request: Request) -> None:
        """Forget a request (finished or preempted) and free what the drafter holds for it."""
        ...


def draw_drafts(
    logits: torch.Tensor,
    requests: Sequence[Request],
    drafts: Sequence[Sequence[int]],
    generator: torch.Generator,
) -> tuple[torch.Tensor | None, list[int]]:
    """One draft token per row of logits [n, target vocab], warped as each request warps (its
    drafts so far in its history): q [n, vocab] and the tokens; q is None when every row is
    greedy (one-hot at the argmax, which the verifier then implies). A seeded request's draft
    is argmax(q / E) with the noise of the output position it guesses, the noise its verifier
    races the target's p with (sample/rejection.py), so the two agree often; others draw from
    `generator`."""
    if all_greedy(requests):
        return None, argmax_rows(logits).tolist()
    t = sampling_tensors(list(zip(requests, drafts, strict=True)), logits.shape[1], logits.device)
    q = warp(logits, t)  # [n, vocab]
    keys = [noise_key(r, len(d)) for r, d in zip(requests, drafts, strict=True)]
    tokens = sample(q, keys, t.greedy, generator)
    return q, tokens.tolist()


def stack_draft_probs(
    drafts: Sequence[Sequence[int]],
    probs: Sequence[Sequence[torch.Tensor | None]],
    vocab_size: int,
    device: torch.device,
) -> torch.Tensor | None:
    """Drafts.probs: q rows [total drafts, vocab] in request order, a one-hot row where a draft
    was greedy (None), or None when every draft was greedy."""
    flat = [
        (d, p) for ds, ps in zip(drafts, probs, strict=True) for d, p in zip(ds, ps, strict=True)
    ]
    if all(p is None for _, p in flat):
        return None
    one_hot = torch.zeros(vocab_size, device=device)
    return torch.stack([
        p if p is not None else one_hot.index_fill(0, torch.tensor(d, device=device), 1.0)
        for d, p in flat
    ])  # fmt: skip


@runtime_checkable
class HoldsKV(Protocol):
    """A drafter with a KV cache of its own (a draft model, an EAGLE head): the engine reports
    its bytes beside the target's (Engine.kv_memory)."""

    @property
    def kv_cache(self) -> KVCache:
        """The drafter's own KV tensors."""
        ...


@runtime_checkable
class FeatureProposer(Proposer, Protocol):
    """A drafter that reads the target's hidden states (EAGLE, Medusa heads)."""

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """Target residual streams it reads (LlamaModel.hidden_states numbering)."""
        ...

    def observe(self, request: Request, start: int, features: torch.Tensor) -> None:
        """Features [n, F] of the target positions start .. start + n - 1 whose KV is kept."""
        ...

    @property
    def reads_every_position(self) -> bool:
        """True when it must observe every position from 0 (its own KV over them): it then
        keeps a prefix cache of its own (kv.prefix_cache.DrafterPrefix), since a request can
        start from a target prefix cache hit only where the drafter's rows are cached too."""
        ...
