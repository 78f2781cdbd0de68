"""Draft-model proposer: a small model of the same family drafts k tokens autoregressively."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from verispec.config import SpecConfig, SpecError, SpecField
from verispec.drafters.draft_vocab import draft_vocab
from verispec.drafters.ngram import Lookup
from verispec.drafters.proposer import draw_drafts, stack_draft_probs
from verispec.engine.drafter import Drafts, TargetInfo
from verispec.engine.request import TokenHistory, all_greedy, num_verified
from verispec.kv import BlockAllocator, BlockTable, PrefixCache
from verispec.kv.cache import KVCache
from verispec.models.kernels.native_layer import can_step_greedily, greedy_steps
from verispec.models.llama import LlamaModel
from verispec.models.paged import PagedModel, append_chunk
from verispec.models.weights.loader import load_model, resolve_model_path
from verispec.sample import argmax_rows
from verispec.sample.grammar import common_prefix
from verispec.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class DraftModelConfig:
    """A draft model's options: its checkpoint, how its weights are rounded, and how much of
    the vocabulary its LM head keeps."""

    SPEC_FIELDS: ClassVar[dict[str, str]] = {"model": "model", "quantization": "quantization",
                                             "draft_vocab_size": "draft_vocab_size"}  # fmt: skip
    model: str | None = None
    """Draft checkpoint directory, GGUF file, named model or hub id (check_spec requires it)."""
    quantization: str | None = None
    draft_vocab_size: int | None = None
    """Token ids the draft's head keeps (SpecConfig.draft_vocab_size); None = all. Its upper
    bound, the vocabulary, is checked at load (drafters/draft_vocab.py)."""

    def __post_init__(self) -> None:
        size = self.draft_vocab_size
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
            raise SpecError(SpecField("draft_vocab_size"), " must be an integer >= 1 (the token "
                            "ids the draft's LM head keeps) or None for the whole vocabulary, "
                            f"got {size!r}")  # fmt: skip

    @classmethod
    def of(cls, spec: SpecConfig) -> DraftModelConfig:
        return spec.options(cls)


@dataclass(slots=True)
class _DraftState:
    """What the draft model's KV cache holds for one request."""

    table: BlockTable
    base: list[int] = field(default_factory=list)
    """Tokens of the request the cache held when the last drafts were made."""
    drafts: list[int] = field(default_factory=list)
    """Draft tokens whose KV the cache also holds, after base."""
    num_indexed: int = 0
    """Leading blocks of table in the draft's prefix cache (prefix_cache.STOP: no more)."""

    def valid_length(self, tokens: list[int]) -> int:
        """Cached positions still valid for tokens: the common prefix of base + drafts (base
        may end in forced drafts the target then rejected: engine.request.AfterForced).

        >>> _DraftState(None, base=[1, 2, 3], drafts=[4, 5]).valid_length([1, 2, 3, 4, 9])
        4
        >>> _DraftState(None, base=[1, 2, 3], drafts=[4]).valid_length([1, 2, 7, 8])
        2
        """
        n = len(self.base)
        if tokens[:n] != self.base:  # rare: forced drafts rejected
            return common_prefix(self.base, tokens)
        for d in self.drafts:
            if n >= len(tokens) or tokens[n] != d:
                break
            n += 1
        return min(n, len(tokens))


class DraftModelProposer:
    """Runs a draft model in lockstep with the target: its own paged KV cache, rolled back to
    the accepted prefix before each proposal; drafts use the request's own sampling warping.
    The model is any LlamaModel over the target's vocabulary: a separate checkpoint (load) or
    the target's own layers with some skipped (drafters/self_draft.py)."""

    continues_forced = True
    """Its cache is checked against each history it is handed, so it drafts on after
    grammar-forced drafts (engine/drafter.py, ContinuesForced) and rolls back any rejected."""

    def __init__(
        self,
        model: LlamaModel,
        num_speculative_tokens: int,
        target: TargetInfo,
        depth: int | None = None,
        lookup: Lookup | None = None,
    ) -> None:
        self.target = target
        self.lookup = lookup
        """Copy first: where prompt lookup continues a request's context, its drafts are that
        copy (free, q one-hot) instead of the draft model's (SpecConfig.prompt_lookup_tokens)."""
        # Headroom beyond the target's blocks: a request may still hold up to k - 1 stale draft
        # slots (not yet rolled back) when it is not drafting this step.
        stale = math.ceil(num_speculative_tokens / target.block_size) + 1
        num_blocks = target.num_blocks + target.max_num_seqs * stale
        self.paged = PagedModel(model, num_blocks, target.block_size)
        self.max_len = model.config.max_position_embeddings
        self.depth = depth
        """Most drafts per request and step (a calibrated k); None = as many as asked."""
        self.states: dict[str, _DraftState] = {}
        self.prefix_cache: PrefixCache | None = None
        """The draft cache's own index of committed full blocks, once enable_prefix_caching."""

    def enable_prefix_caching(self) -> None:
        """Index the draft cache's blocks of committed tokens: a request starting here (new or
        preempted) reuses the longest cached prefix of its tokens instead of prefilling it."""
        self.prefix_cache = PrefixCache(self.allocator, self.paged.block_size)

    @classmethod
    def load(
        cls, model: str, quantization: str | None, num_speculative_tokens: int, target: TargetInfo,
        draft_vocab_size: int | None = None, lookup: Lookup | None = None,
    ) -> DraftModelProposer:  # fmt: skip
        """A proposer over the draft checkpoint `model` (a directory, GGUF file or name), loaded
        as the target is (dtype, device, kernels, compile), its weights rounded by `quantization`
        (resolved: spec/resolve.py decides "auto"), its LM head cut to `draft_vocab_size` token
        ids (draft_vocab.py; None: the whole vocabulary); its tokenizer must be the target's."""
        path = resolve_model_path(model)
        tokenizer = Tokenizer(path)
        check_vocabularies(target.tokenizer, tokenizer)
        needed = min(target.vocab_size, tokenizer.vocab_size)  # ids the target can feed it
        vocab_ids = None
        if draft_vocab_size is not None:
            vocab_ids = draft_vocab(tokenizer, draft_vocab_size, needed)
        loaded = load_model(
            path, target.dtype, target.device, target.linear_backend,
            batch_invariant=target.batch_invariant, quantization=quantization,
            compile=target.compile, vocab_ids=vocab_ids,
        )  # fmt: skip
        check_embedding_covers(loaded.config.vocab_size, needed, path)
        return cls(loaded, num_speculative_tokens, target, lookup=lookup)

    @property
    def model(self) -> LlamaModel:
        return self.paged.model

    @property
    def allocator(self) -> BlockAllocator:
        return self.paged.allocator

    @property
    def kv_cache(self) -> KVCache:
        return self.paged.kv

    def propose(self, requests: Sequence[TokenHistory], num_tokens: Sequence[int]) -> Drafts:
        """k_i tokens per request: a prompt-lookup copy where the lookup finds one (with a
        lookup), else the draft model's (_draft)."""
        cap = self.depth or max(num_tokens, default=0)
        ks = [
            min(k, cap, self.max_len - r.num_tokens)
            for r, k in zip(requests, num_tokens, strict=True)
        ]
        drafts = [self.lookup.chain(r, k) if self.lookup and k else []
                  for r, k in zip(requests, ks, strict=True)]  # fmt: skip
        probs: list[list[torch.Tensor | None]] = [[None] * len(d) for d in drafts]  # one-hot q
        rows = [i for i, (k, d) in enumerate(zip(ks, drafts, strict=True)) if k and not d]
        drafted, drafted_probs = self._draft([requests[i] for i in rows], [ks[i] for i in rows])
        for j, i in enumerate(rows):
            drafts[i], probs[i] = drafted[j], drafted_probs[j]
        q_rows = stack_draft_probs(drafts, probs, self.target.vocab_size, self.model.device)
        return Drafts(token_ids=drafts, probs=q_rows)

    def _draft(
        self, requests: list[TokenHistory], ks: list[int]
    ) -> tuple[list[list[int]], list[list[torch.Tensor | None]]]:
        """The draft model's k_i tokens per request and their q rows (None: one-hot): the first
        forward catches the draft cache up with the tokens accepted since last time, then one
        batched forward per further draft position."""
        drafts: list[list[int]] = [[] for _ in requests]
        probs: list[list[torch.Tensor | None]] = [[] for _ in requests]  # None: one-hot q
        for step in range(max(ks, default=0)):
            if step == 1 and self._step_greedily(requests, ks, drafts, probs):
                break
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
        return drafts, probs

    def _step_greedily(
        self, requests: Sequence[TokenHistory], ks: list[int], drafts: list[list[int]],
        probs: list[list[torch.Tensor | None]],
    ) -> bool:  # fmt: skip
        """After the first draft step: every further step in one native call
        (native_layer.greedy_steps), when every request is greedy and takes the same k and the
        model can; the tokens are those the loop of forwards would draw. False: not taken."""
        if not (all_greedy(requests) and len(set(ks)) == 1 and can_step_greedily(self.model)):
            return False
        steps = ks[0] - 1
        states = [self.states[r.request_id] for r in requests]
        positions = [s.table.num_tokens for s in states]  # where each last draft goes
        reserved = [s.table.append_slots(steps) for s in states]
        tokens = greedy_steps(
            self.model, self.paged.kv, [d[-1] for d in drafts], positions,
            [[slots[j] for slots in reserved] for j in range(steps)],
            [s.table.blocks for s in states], self.paged.block_size, self._head_rows(),
        )  # fmt: skip
        for row in tokens:
            for i, token in enumerate(row):
                drafts[i].append(token)
                probs[i].append(None)
        return True

    def _head_rows(self) -> int:
        """Rows of the draft's logits that score target ids: a reduced head's every row, else
        the ids both vocabularies have (not the draft's padding rows)."""
        if self.model.vocab_ids is not None:
            return len(self.model.vocab_ids)
        return min(self.target.vocab_size, self.model.config.vocab_size)

    def _sample(
        self, logits: torch.Tensor, requests: list[TokenHistory], drafts: list[list[int]]
    ) -> tuple[torch.Tensor | None, list[int]]:
        """q [n, target vocab] after the request's own warping, and one draft token per row.
        All greedy: the argmax of the head's rows that score target ids, mapped to its ids (the
        one over the full vocabulary with -inf elsewhere, without building it every step)."""
        if all_greedy(requests):
            tokens = argmax_rows(logits[:, : self._head_rows()])
            ids = self.model.vocab_ids
            return None, (tokens if ids is None else ids[tokens]).tolist()
        logits = _match_vocab(logits, self.target.vocab_size, self.model.vocab_ids)
        return draw_drafts(logits, requests, drafts, self.target.generator)

    def release(self, request: TokenHistory) -> None:
        """Free the draft KV blocks of a finished or preempted request."""
        state = self.states.pop(request.request_id, None)
        if state is not None:
            state.table.free()

    def _forward(self, requests: list[TokenHistory], drafts: list[list[int]]) -> torch.Tensor:
        """One draft forward: for each request the tokens its draft cache lacks; logits [n, V]."""
        chunks = []
        for r, d in zip(requests, drafts, strict=True):
            state = self.states.get(r.request_id) or self._start(r)
            tokens = r.all_token_ids + d
            if not d:  # first draft step: roll back to what is still valid (keep >= 1 to feed)
                state.table.truncate(min(state.valid_length(tokens), len(tokens) - 1))
            chunks.append(append_chunk(state.table, tokens[state.table.num_tokens :]))
        logits = self.paged.forward(chunks)
        if self.prefix_cache is not None and not any(drafts):  # the catch-up: once a proposal
            for r in requests:  # blocks of committed tokens only: rollback never rewrites them
                s = self.states[r.request_id]
                committed = min(s.table.num_tokens, num_verified(r) - 1)
                s.num_indexed = self.prefix_cache.insert(s.table, r.all_token_ids, s.num_indexed,
                                                         committed)  # fmt: skip
        return logits

    def _start(self, request: TokenHistory) -> _DraftState:
        """A new state for the request, holding its longest cached prefix when caching."""
        state = self.states[request.request_id] = _DraftState(self.paged.new_table())
        if self.prefix_cache is not None:
            tokens = request.all_token_ids
            blocks = self.prefix_cache.match(tokens)
            state.table.share(blocks)
            state.num_indexed = len(blocks)
            state.base = tokens[: state.table.num_tokens]
            self.prefix_cache.record(len(tokens), state.table.num_tokens)
        return state


def _match_vocab(
    logits: torch.Tensor, vocab_size: int, vocab_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """Draft logits [n, V] over the target's vocab_size ids: a reduced head's column j at id
    vocab_ids[j] and -inf at every id it lacks (so q = 0 there, and the verifier's residual
    max(0, p - q) gives those ids their whole p); else extra padding columns dropped, missing
    ones -inf."""
    n, v = logits.shape
    if vocab_ids is not None:
        full = logits.new_full((n, vocab_size), float("-inf"))
        return full.index_copy_(1, vocab_ids, logits)
    if v >= vocab_size:
        return logits[:, :vocab_size]
    pad = torch.full((n, vocab_size - v), float("-inf"), dtype=logits.dtype, device=logits.device)
    return torch.cat([logits, pad], dim=1)


def check_embedding_covers(rows: int, needed: int, path: object) -> None:
    """A draft whose embedding has fewer rows than the token ids it may be fed (those of the
    tokenizer that the target can emit) would fail mid-generation the first time such an id
    comes: refuse it at load."""
    if rows < needed:
        raise ValueError(
            f"draft model {path} has {rows} embedding rows but the tokenizer and target use "
            f"{needed} token ids; the draft's vocabulary must cover every one of them"
        )


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
