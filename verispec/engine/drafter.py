"""The drafter contract the engine defines: what a drafter is told of the target (TargetInfo),
what it returns (Drafts), the calls every drafter answers (Proposer) and the optional
capabilities the engine looks for (a KV cache of its own, the target's features)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from verispec.engine.request import Request
from verispec.kv.cache import KVCache
from verispec.models.llama import LlamaModel
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


MakeDrafter = Callable[[TargetInfo], Proposer]
"""Builds the drafter once the engine knows its target (the API layer hands the engine one:
drafters.registry.make_proposer bound to a resolved SpecConfig)."""
