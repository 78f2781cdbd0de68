"""The drafter contract, the one place that names it: what a drafter is told of the target
(TargetInfo), what it reads of each request (engine.request.TokenHistory: its id, tokens and
sampling, not the engine's Request), what it returns (Drafts), the calls every drafter answers
(Proposer), and the optional capabilities the engine looks for (HoldsKV: a KV cache of its own;
CachesPrefixes and DrafterPrefix: its own prefix cache; FeatureProposer: the target's
features; ContinuesForced: drafting on after grammar-forced drafts), found once when the
engine is built (Capabilities.of), which also checks how they must pair."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from verispec.engine.request import TokenHistory
from verispec.kv.cache import KVCache
from verispec.kv.prefix_cache import PrefixCache
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


@runtime_checkable
class Proposer(Protocol):
    """A drafter: guesses up to k tokens for each request; the verifier keeps what is right."""

    def propose(self, requests: Sequence[TokenHistory], num_tokens: Sequence[int]) -> Drafts:
        """Draft up to num_tokens[i] tokens continuing requests[i].all_token_ids."""
        ...

    def release(self, request: TokenHistory) -> None:
        """Forget a request (finished or preempted) and free what the drafter holds for it."""
        ...


@runtime_checkable
class ContinuesForced(Protocol):
    """A drafter that drafts on after a request's grammar-forced drafts (handed the request as
    an engine.request.AfterForced): it reads only the tokens of the history it is given and
    keeps nothing that forced tokens the target then rejects could spoil. Other drafters are
    not asked to draft for a request in a step that has forced drafts."""

    @property
    def continues_forced(self) -> bool:
        """True (its presence marks the capability)."""
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

    def observe(self, request: TokenHistory, start: int, features: torch.Tensor) -> None:
        """Features [n, F] of the target positions start .. start + n - 1 whose KV is kept."""
        ...

    @property
    def reads_every_position(self) -> bool:
        """True when it must observe every position from 0 (its own KV over them): it then
        keeps a prefix cache of its own (DrafterPrefix), since a request can
        start from a target prefix cache hit only where the drafter's rows are cached too."""
        ...


@runtime_checkable
class CachesPrefixes(Protocol):
    """A drafter with a KV cache of its own that can index it too (a draft model: its blocks
    depend on tokens alone, so it matches its own cache whenever it starts a request)."""

    prefix_cache: PrefixCache | None
    """Its index of its own full blocks once enabled (the engine empties it with the
    target's: Engine.reset_prefix_cache)."""

    def enable_prefix_caching(self) -> None:
        """Start indexing the drafter's computed blocks."""
        ...


@runtime_checkable
class DrafterPrefix(CachesPrefixes, Protocol):
    """A drafter whose own KV cache covers every position from the target's features (an EAGLE
    head): a target prefix hit reuses only as many blocks as the drafter also has, so the
    drafter starts where the target starts."""

    def cached_prefix_blocks(self, token_ids: Sequence[int]) -> int:
        """Leading full blocks of token_ids the drafter's cache holds (taking nothing)."""
        ...

    def adopt_prefix(self, request_id: str, token_ids: Sequence[int], num_blocks: int) -> None:
        """Start the request's drafter state with its first num_blocks cached blocks (at most
        cached_prefix_blocks, asked within the same scheduling pass)."""
        ...


@dataclass(frozen=True, slots=True)
class Capabilities:
    """The optional capabilities of the engine's drafter, each the drafter itself or None."""

    own_kv: HoldsKV | None = None
    prefixes: CachesPrefixes | None = None
    """It indexes its own KV blocks when the engine caches prefixes."""
    features: FeatureProposer | None = None
    """It reads the target's features (the engine asks the forward for them)."""
    shared_prefix: DrafterPrefix | None = None
    """A feature drafter that reads every position: a target prefix hit is cut to its blocks."""
    continues_forced: ContinuesForced | None = None
    """It drafts on after a request's grammar-forced drafts."""

    @classmethod
    def of(cls, proposer: Proposer | None) -> Capabilities:
        """Find a built drafter's capabilities, once. A TypeError when it is no Proposer, or
        reads every position without a prefix cache of its own (DrafterPrefix)."""
        if proposer is None:
            return cls()
        if not isinstance(proposer, Proposer):
            raise TypeError(f"{type(proposer).__name__} is no drafter (engine.drafter.Proposer: "
                            "propose and release)")  # fmt: skip
        features = proposer if isinstance(proposer, FeatureProposer) else None
        shared = None
        if features is not None and features.reads_every_position:
            if not isinstance(features, DrafterPrefix):
                raise TypeError(f"{type(features).__name__} reads every position but keeps "
                                "no prefix cache (engine.drafter.DrafterPrefix)")  # fmt: skip
            shared = features
        return cls(
            own_kv=proposer if isinstance(proposer, HoldsKV) else None,
            prefixes=proposer if isinstance(proposer, CachesPrefixes) else None,
            features=features, shared_prefix=shared,
            continues_forced=proposer if isinstance(proposer, ContinuesForced) else None,
        )  # fmt: skip


MakeDrafter = Callable[[TargetInfo], Proposer]
"""Builds the drafter once the engine knows its target (the API layer hands the engine one:
drafters.registry.make_proposer bound to a ResolvedSpec)."""
