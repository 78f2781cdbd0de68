"""EAGLE proposer: an EAGLE-3 head drafts from the target's own features, as a chain or as
EAGLE-2's dynamic tree.

Head row r reads token r + 1 and the target's features of position r (or, deeper than the
target has computed, the head's own output of the row before); see verispec/models/eagle.py.
Each proposal first catches the head's KV cache up with the positions the target computed
since the last one (their features arrive through `observe`), then drafts:

- chain (tree_topk 1): k tokens, one head forward each, greedy or sampled from the request's
  own warping of the head's distribution (q is returned for the rejection sampler);
- tree (tree_topk K >= 2, EAGLE-2): every node of the current frontier proposes its K most
  probable children scored by cumulative draft log-probability; the K best of those form the
  next frontier, fed to the head in one forward with a tree attention mask; after tree_depth
  levels every candidate is reranked and the best num_speculative_tokens (closed under
  ancestors) form the tree the target verifies. Nodes are deterministic (point-mass drafts).
  With a Lookup, a prompt-lookup chain (drafters/ngram.py) is grafted onto the tree: the head
  keeps the budget the chain does not use, and copied text is drafted at no head cost.

Draft nodes' KV in the head cache is dropped at the next proposal (truncated to the rows
computed from true features), like the draft model's rollback.

With prefix caching (`enable_prefix_caching`), the head indexes its full blocks of true rows
in a PrefixCache of its own, keyed one token further than the target's (row r reads token
r + 1); a target prefix hit is cut to the blocks the head also holds, and the head starts the
request from them (`adopt_prefix`), so neither recomputes the shared prefix.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from verispec.drafters.ngram import Lookup
from verispec.drafters.proposer import draw_drafts, stack_draft_probs
from verispec.engine.drafter import Drafts, TargetInfo
from verispec.engine.request import TokenHistory, all_greedy
from verispec.kv import BlockAllocator, BlockTable, PrefixCache
from verispec.kv.cache import KVCache
from verispec.models.batch import ForwardBatch, SeqChunk
from verispec.models.eagle import EagleHead
from verispec.models.paged import append_chunk
from verispec.sample.sampler import argmax_rows
from verispec.sample.tree import DraftTree


@dataclass(slots=True)
class _HeadState:
    """What the head holds for one request."""

    table: BlockTable
    rows: int = 0
    """Head rows computed from true target features (row r: token r + 1, features of r)."""
    pending: list[torch.Tensor] = field(default_factory=list)
    """Target features [n, F] of positions rows, rows + 1, ... not yet read by the head."""
    num_indexed: int = 0
    """Leading blocks of table in the head's prefix cache (prefix_cache.STOP: no more)."""

    @property
    def observed(self) -> int:
        """Target positions whose features the head has read or holds."""
        return self.rows + sum(len(f) for f in self.pending)


@dataclass(slots=True)
class _Start:
    """Where one proposal's drafting starts: the requests, their head states, and the head's
    output and draft logits at each request's last position."""

    requests: Sequence[TokenHistory]
    states: list[_HeadState]
    out: torch.Tensor
    """[n, hidden] the head's output at each request's last position."""
    logits: torch.Tensor
    """[n, draft vocab] the head's draft logits there."""


@dataclass(slots=True)
class _Candidate:
    """A tree candidate: its target token, head input row parent and cumulative log q."""

    token: int
    parent: int
    """Candidate index of the parent, -1 for the root's children."""
    depth: int
    score: float


class EagleProposer:
    """Drafts with an EAGLE head over the target's features (see the module docstring)."""

    def __init__(
        self,
        head: EagleHead,
        num_speculative_tokens: int,
        tree_topk: int,
        tree_depth: int,
        target: TargetInfo,
        lookup: Lookup | None = None,
    ) -> None:
        check_topk(tree_topk, head.config.draft_vocab_size)
        self.head = head
        self.lookup = lookup  # trees only: a prompt-lookup chain grafted onto each
        self.target = target
        self.topk = tree_topk
        self.depth = tree_depth if tree_topk > 1 else num_speculative_tokens
        # Headroom per request for the nodes fed while drafting (rolled back next time).
        fed = 1 + (tree_topk * tree_depth if tree_topk > 1 else num_speculative_tokens)
        per_seq = math.ceil(fed / target.block_size) + 1
        num_blocks = target.num_blocks + target.max_num_seqs * per_seq
        self.block_size = target.block_size
        self.kv = head.new_kv_cache(num_blocks, target.block_size)
        self.allocator = BlockAllocator(num_blocks)
        self.states: dict[str, _HeadState] = {}
        self.prefix_cache: PrefixCache | None = None
        """The head's own index of full blocks of true rows, once enable_prefix_caching."""

    @property
    def kv_cache(self) -> KVCache:
        return self.kv

    def enable_prefix_caching(self) -> None:
        """Index the head's computed blocks so requests sharing a prefix reuse them."""
        self.prefix_cache = PrefixCache(self.allocator, self.block_size, lookahead=1)

    def cached_prefix_blocks(self, token_ids: Sequence[int]) -> int:
        """Leading full blocks of token_ids whose head rows are cached (taking nothing)."""
        return 0 if self.prefix_cache is None else len(self.prefix_cache.peek(token_ids))

    def adopt_prefix(self, request_id: str, token_ids: Sequence[int], num_blocks: int) -> None:
        """Start the request's head state from its first num_blocks cached blocks."""
        if self.prefix_cache is None or num_blocks == 0:
            return
        blocks = self.prefix_cache.match(token_ids, num_blocks)
        if len(blocks) != num_blocks:
            raise RuntimeError(f"EAGLE head cache holds {len(blocks)} blocks of request "
                               f"{request_id}'s prefix, not the {num_blocks} promised")  # fmt: skip
        self.release_id(request_id)
        table = BlockTable(self.allocator, self.block_size)
        table.share(blocks)
        self.states[request_id] = _HeadState(table, rows=table.num_tokens, num_indexed=num_blocks)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """Target residual streams the engine must hand over through observe()."""
        return self.head.feature_layers

    def observe(self, request: TokenHistory, start: int, features: torch.Tensor) -> None:
        """Features [n, F] of target positions start .. start + n - 1, whose KV the target
        keeps (prefill chunks, the verified token and accepted drafts)."""
        state = self.states.get(request.request_id)
        if state is None or start == 0:
            if state is not None:
                state.table.free()
            state = self.states[request.request_id] = _HeadState(
                BlockTable(self.allocator, self.block_size)
            )
        if start != state.observed:
            raise RuntimeError(
                f"EAGLE head got features of position {start} for request "
                f"{request.request_id}, expected {state.observed}"
            )
        state.pending.append(features)

    @property
    def reads_every_position(self) -> bool:
        """True: the head's own KV covers every position, built from the target's features."""
        return True

    def release(self, request: TokenHistory) -> None:
        """Free the head's KV blocks of a finished or preempted request."""
        self.release_id(request.request_id)

    def release_id(self, request_id: str) -> None:
        """Free the head's KV blocks of the request with this id, if it holds any."""
        state = self.states.pop(request_id, None)
        if state is not None:
            state.table.free()

    def propose(self, requests: Sequence[TokenHistory], num_tokens: Sequence[int]) -> Drafts:
        """A chain (tree_topk 1) or a tree of up to num_tokens[i] nodes per request."""
        ks = [min(k, self.head.config.max_position_embeddings - r.num_tokens)
              for r, k in zip(requests, num_tokens, strict=True)]  # fmt: skip
        start = self._catch_up(requests, [self._caught_up_state(r) for r in requests])
        if self.topk == 1:
            return self._chain(start, ks)
        if self.lookup is None:
            trees = self._trees(start, ks)
        else:  # the head's tree keeps room for the lookup chain, grafted after
            chains = [self.lookup.chain(r, k - 1) for r, k in zip(requests, ks, strict=True)]
            own = [k - len(c) for k, c in zip(ks, chains, strict=True)]
            trees = self._trees(start, own)
            trees = [t.graft(c) for t, c in zip(trees, chains, strict=True)]
        return Drafts(token_ids=[t.token_ids for t in trees], probs=None, trees=trees)

    def _caught_up_state(self, request: TokenHistory) -> _HeadState:
        state = self.states.get(request.request_id)
        if state is None or state.observed != request.num_tokens - 1:
            raise RuntimeError(
                f"EAGLE head has features of {0 if state is None else state.observed} positions "
                f"of request {request.request_id}, needs {request.num_tokens - 1} to draft"
            )
        return state

    def _forward(
        self, chunks: list[SeqChunk], feature: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch = ForwardBatch.build(chunks, self.block_size, self.head.device)
        return self.head.forward(batch, self.kv, feature)

    def _catch_up(self, requests: Sequence[TokenHistory], states: list[_HeadState]) -> _Start:
        """Head rows for every position the target computed since last time; drafting starts
        from each request's last row."""
        chunks, features = [], []
        for r, s in zip(requests, states, strict=True):
            s.table.truncate(s.rows)  # drop the last proposal's draft rows
            new = torch.cat(s.pending)  # [m, F]
            tokens = r.all_token_ids[s.rows + 1 : s.rows + 1 + len(new)]
            chunks.append(append_chunk(s.table, tokens))
            features.append(new)
            s.rows += len(new)
            s.pending = []
            if self.prefix_cache is not None:
                s.num_indexed = self.prefix_cache.insert(s.table, r.all_token_ids, s.num_indexed,
                                                         s.rows)  # fmt: skip
        out, logits = self._forward(chunks, self.head.fuse(torch.cat(features)))
        ends = itertools.accumulate(len(c.token_ids) for c in chunks)
        last = torch.tensor([e - 1 for e in ends], device=out.device)  # [n] each chunk's last row
        return _Start(requests, states, out.index_select(0, last), logits)

    def _chain(self, start: _Start, ks: list[int]) -> Drafts:
        """k tokens per request, one batched head step each."""
        requests, states = start.requests, start.states
        drafts: list[list[int]] = [[] for _ in requests]
        probs: list[list[torch.Tensor | None]] = [[] for _ in requests]  # None: one-hot q
        active = [i for i, k in enumerate(ks) if k > 0]
        out, logits = start.out[active], start.logits[active]  # row j: request active[j]
        while active:
            q, tokens = self._pick([requests[i] for i in active], [drafts[i] for i in active],
                                   logits)  # fmt: skip
            for row, i in enumerate(active):
                drafts[i].append(tokens[row])
                probs[i].append(None if q is None else q[row])
            keep = [row for row, i in enumerate(active) if len(drafts[i]) < ks[i]]
            active = [active[row] for row in keep]
            if active:
                chunks = [append_chunk(states[i].table, drafts[i][-1:]) for i in active]
                out, logits = self._forward(chunks, out[keep])
        q_rows = stack_draft_probs(drafts, probs, self.target.vocab_size, self.head.device)
        return Drafts(token_ids=drafts, probs=q_rows)

    def _pick(
        self, requests: list[TokenHistory], drafts: list[list[int]], logits: torch.Tensor
    ) -> tuple[torch.Tensor | None, list[int]]:
        """One draft token per row of draft logits [n, draft vocab]: the argmax, or a sample
        from the request's warping of the head's distribution over target ids."""
        if all_greedy(requests):
            return None, self.head.draft_to_target[argmax_rows(logits)].tolist()
        full = torch.full((len(requests), self.target.vocab_size), float("-inf"),
                          device=logits.device)  # fmt: skip
        full[:, self.head.draft_to_target] = logits  # [n, vocab]
        return draw_drafts(full, requests, drafts, self.target.generator)

    def _trees(self, start: _Start, ks: list[int]) -> list[DraftTree]:
        """EAGLE-2's dynamic tree per request, one batched head forward per level."""
        requests, states, out, logits = start.requests, start.states, start.out, start.logits
        nodes: list[list[_Candidate]] = [[] for _ in requests]
        fed: list[list[int]] = [[] for _ in requests]  # candidates fed, in head-cache order
        live = [i for i, k in enumerate(ks) if k > 0]
        frontier = {i: self._expand(nodes[i], logits[i : i + 1], [-1], [0.0], 1) for i in live}
        outs = {i: out[i : i + 1].expand(len(frontier[i]), -1) for i in live}  # parent outputs
        for depth in range(1, self.depth):
            live = [i for i in live if depth < min(self.depth, ks[i])]
            if not live:
                break
            chunks = [
                append_chunk(
                    states[i].table,
                    [nodes[i][c].token for c in frontier[i]],
                    num_logits=len(frontier[i]),
                    extra_mask=self._frontier_mask(nodes[i], fed[i], frontier[i]),
                    positions=[requests[i].num_tokens - 1 + depth - 1] * len(frontier[i]),
                )
                for i in live
            ]
            new_out, new_logits = self._forward(chunks, torch.cat([outs[i] for i in live]))
            sizes = [len(frontier[i]) for i in live]
            for i, o, lg in zip(live, new_out.split(sizes), new_logits.split(sizes), strict=True):
                parents = frontier[i]
                fed[i] += parents
                scores = [nodes[i][c].score for c in parents]
                frontier[i] = self._expand(nodes[i], lg, parents, scores, depth + 1)
                outs[i] = o[[parents.index(nodes[i][c].parent) for c in frontier[i]]]
        return [
            _rerank(n, k) if k > 0 else DraftTree([], []) for n, k in zip(nodes, ks, strict=True)
        ]

    def _expand(
        self, nodes: list[_Candidate], logits: torch.Tensor, parents: list[int],
        scores: list[float], depth: int,
    ) -> list[int]:  # fmt: skip
        """Add each parent's top-K children (logits [P, draft vocab]) to nodes; return the K
        best new candidates by cumulative log-probability (the next frontier)."""
        logq, ids = torch.log_softmax(logits.float(), dim=-1).topk(self.topk, dim=-1)  # [P, K]
        tokens = self.head.draft_to_target[ids].tolist()
        first = len(nodes)
        for p, (parent, score) in enumerate(zip(parents, scores, strict=True)):
            for lq, token in zip(logq[p].tolist(), tokens[p], strict=True):
                nodes.append(_Candidate(token, parent, depth, score + lq))
        new = range(first, len(nodes))
        return sorted(new, key=lambda c: -nodes[c].score)[: self.topk]

    @staticmethod
    def _frontier_mask(
        nodes: list[_Candidate], fed: list[int], frontier: list[int]
    ) -> torch.Tensor:
        """[F, len(fed) + F] which fed nodes (ancestors) and new nodes (itself) each sees."""
        where = {c: i for i, c in enumerate(fed)}
        mask = torch.zeros(len(frontier), len(fed) + len(frontier), dtype=torch.bool)
        for row, c in enumerate(frontier):
            mask[row, len(fed) + row] = True
            a = nodes[c].parent
            while a >= 0:
                mask[row, where[a]] = True
                a = nodes[a].parent
        return mask


def check_topk(topk: int, draft_vocab_size: int) -> None:
    """A node cannot have more children than the head has tokens."""
    if topk > draft_vocab_size:
        raise ValueError(f"tree_topk {topk} exceeds the head's draft vocabulary "
                         f"({draft_vocab_size} tokens)")  # fmt: skip


def _rerank(nodes: list[_Candidate], budget: int) -> DraftTree:
    """The `budget` best candidates by score, closed under ancestors, as a DraftTree in
    depth order. E.g. scores a=-0.1, a/b=-0.5, c=-0.7 with budget 2 keep a and a/b."""
    order = sorted(range(len(nodes)), key=lambda c: (-nodes[c].score, nodes[c].depth, c))
    chosen: set[int] = set()
    for c in order:
        if len(chosen) == budget:
            break
        if nodes[c].parent < 0 or nodes[c].parent in chosen:
            chosen.add(c)
    kept = sorted(chosen, key=lambda c: (nodes[c].depth, c))
    index = {c: i for i, c in enumerate(kept)}
    return DraftTree(
        token_ids=[nodes[c].token for c in kept],
        parents=[index[nodes[c].parent] if nodes[c].parent >= 0 else -1 for c in kept],
    )
