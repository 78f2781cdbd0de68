"""Suffix decoding: draft trees grown from what followed the newest tokens before, in this
request and in earlier requests' outputs (Oliaro et al. 2024, "SuffixDecoding", arXiv
2411.04975; vLLM's method "suffix").

No model: two suffix tries (drafters/suffix_trie.py) count which tokens followed every short
run of tokens, one over the request's own prompt and output (extended as tokens arrive), one
over the outputs of finished requests (the last max_cached_requests of them). Each step the
longest suffix of the request's tokens that occurred before is matched in each trie, and a
tree is grown from the most frequent continuations, best first by their empirical probability;
the tree with the higher expected number of accepted tokens is drafted. Nodes are deterministic
(point-mass drafts, probs None), so any tree is verified exactly (docs/design.md, 3).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from verispec.config import SpecConfig
from verispec.drafters.suffix_trie import CachedOutputs, Cursor, SuffixTrie
from verispec.engine.drafter import Drafts
from verispec.engine.request import TokenHistory
from verispec.sample.tree import DraftTree


@dataclass(frozen=True, slots=True)
class SuffixConfig:
    """Suffix decoding's limits (vLLM's suffix_decoding_* options)."""

    SPEC_FIELDS: ClassVar[dict[str, str]] = {
        name: f"suffix_decoding_{name}"
        for name in ("max_tree_depth", "max_spec_factor", "min_token_prob", "max_cached_requests")
    }
    max_tree_depth: int = 24
    """Longest run the tries count: the matched suffix plus the drafted path below it."""
    max_spec_factor: float = 1.0
    """Node budget per step: at most this many times the matched suffix's length."""
    min_token_prob: float = 0.1
    """Smallest empirical probability of a drafted node's path."""
    max_cached_requests: int = 10_000
    """Finished requests' outputs kept to draft from (oldest evicted; 0 = none)."""

    def __post_init__(self) -> None:
        def number(value: object) -> bool:
            return isinstance(value, int | float) and not isinstance(value, bool)

        depth, factor, prob, cached = (self.max_tree_depth, self.max_spec_factor,
                                       self.min_token_prob, self.max_cached_requests)  # fmt: skip
        if not (isinstance(depth, int) and number(depth) and depth >= 1):
            raise ValueError(f"max_tree_depth must be an integer >= 1, got {depth!r}")
        if not (number(factor) and 0 < factor < float("inf")):
            raise ValueError(f"max_spec_factor must be a number > 0, got {factor!r}")
        if not (number(prob) and 0 <= prob <= 1):
            raise ValueError(f"min_token_prob must be a number in [0, 1], got {prob!r}")
        if not (isinstance(cached, int) and number(cached) and cached >= 0):
            raise ValueError(f"max_cached_requests must be an integer >= 0, got {cached!r}")

    @classmethod
    def of(cls, spec: SpecConfig) -> SuffixConfig:
        """The suffix_decoding_* options of spec, defaults filled; errors name those fields."""
        try:
            return spec.options(cls)
        except ValueError as e:
            raise ValueError(f"suffix_decoding_{e}") from None


@dataclass(frozen=True, slots=True)
class Speculation:
    """A draft tree, its expected accepted tokens under the counts, and the match it grew from."""

    tree: DraftTree
    score: float
    match_length: int


NO_SPECULATION = Speculation(DraftTree([], []), 0.0, 0)


def grow_tree(
    trie: SuffixTrie, cursor: Cursor, budget: int, min_prob: float
) -> tuple[DraftTree, float]:
    """The tree of at most `budget` continuations of cursor's path, best first by empirical
    path probability (a child's count over the occurrences of its parent that continued,
    multiplied down the path), keeping paths of probability >= min_prob; returns the tree
    (nodes in the order taken, so parents come first) and its score, the sum of its nodes' path
    probabilities (the expected accepted drafts if the counts were the target's distribution).

    Worked example: after the match, 5 was followed 3 times and 7 once; after 5, 2 came 3
    times. Budget 3, min_prob 0.1: take 5 (0.75), then 2 below it (0.75 * 3/3 = 0.75), then
    7 (0.25): token_ids [5, 2, 7], parents [-1, 0, -1], score 1.75. With min_prob 0.3, 7 is
    dropped: [5, 2], score 1.5.
    """
    tokens: list[int] = []
    parents: list[int] = []
    score = 0.0
    order = itertools.count()  # ties go to the candidate found first
    heap: list[tuple[float, int, int, int, Cursor]] = []  # (-prob, order, parent, token, cursor)

    def offer(at: Cursor, parent: int, prob: float) -> None:
        nxt = trie.next_tokens(at)
        total = sum(count for _, count, _ in nxt)
        for token, count, child in nxt:
            p = prob * count / total
            if p >= min_prob:
                heapq.heappush(heap, (-p, next(order), parent, token, child))

    offer(cursor, -1, 1.0)
    while heap and len(tokens) < budget:
        neg_prob, _, parent, token, child = heapq.heappop(heap)
        tokens.append(token)
        parents.append(parent)
        score -= neg_prob
        offer(child, len(tokens) - 1, -neg_prob)
    return DraftTree(tokens, parents), score


def match_lengths(longest: int, k: int, config: SuffixConfig) -> list[int]:
    """Match lengths worth growing a tree from: the longest match, and, when a shorter one
    leaves room for a longer path (a trie counts at most max_tree_depth tokens, match and
    path together), the one allowing the longest chain min(k, factor m, depth - m).
    E.g. depth 24, factor 1, k 16, longest 20 -> [20, 12]: 20 leaves room for 4, 12 for 12."""
    if longest == 0:
        return []

    def room(m: int) -> int:
        return min(k, int(config.max_spec_factor * m), config.max_tree_depth - m)

    roomiest = max(range(longest, 0, -1), key=room)  # the longest m among equals
    return [longest] if roomiest == longest else [longest, roomiest]


def speculate(
    tries: Sequence[SuffixTrie], context: Sequence[int], k: int, config: SuffixConfig
) -> Speculation:
    """The best draft tree of at most k nodes continuing `context` from any of the tries.

    For each trie and match length (match_lengths), a tree of at most min(k, max_spec_factor
    x match length) nodes is grown (grow_tree); the highest score wins (ties: the trie listed
    first, the longer match). A tree is only grown when its budget could beat the best score.
    Worked example, a request's own trie holding [1, 2, 3, 1, 2] and that context, k 4,
    defaults: [1, 2] occurred before, followed by 3 ([3, 1, 2] only as the context itself),
    so the match is 2 and the budget 2: the tree is 3, then 1 below it (what followed
    [1, 2, 3]), both of probability 1: token_ids [3, 1], parents [-1, 0], score 2.
    """
    candidates = []  # (budget, m, trie order, trie)
    for i, trie in enumerate(tries):
        for m in match_lengths(trie.longest_match(context), k, config):
            candidates.append((min(k, int(config.max_spec_factor * m)), m, -i, trie))
    best = NO_SPECULATION
    for budget, m, _, trie in sorted(candidates, key=lambda c: c[:3], reverse=True):
        if budget <= best.score:
            break
        cursor = trie.find(context[len(context) - m :])
        if cursor is None:  # longest_match found it, so this cannot happen
            raise RuntimeError(f"suffix of length {m} vanished from the trie")
        tree, score = grow_tree(trie, cursor, budget, config.min_token_prob)
        if score > best.score:
            best = Speculation(tree, score, m)
    return best


class SuffixProposer:
    """The suffix decoding drafter (see the module docstring): trees, deterministic nodes."""

    def __init__(self, config: SuffixConfig) -> None:
        self.config = config
        self.cached = CachedOutputs(config.max_tree_depth, config.max_cached_requests)
        """Finished requests' outputs."""
        self.requests: dict[str, SuffixTrie] = {}
        """Per request being drafted for: its prompt and output so far (one sequence, key 0)."""

    def propose(self, requests: Sequence[TokenHistory], num_tokens: Sequence[int]) -> Drafts:
        """A tree of at most num_tokens[i] nodes per request (possibly empty)."""
        trees = []
        for request, k in zip(requests, num_tokens, strict=True):
            own = self._own_trie(request)
            spec = NO_SPECULATION
            if k > 0:
                spec = speculate((own, self.cached.trie), own.sequence(0), k, self.config)
            trees.append(spec.tree)
        return Drafts(token_ids=[t.token_ids for t in trees], probs=None, trees=trees)

    def release(self, request: TokenHistory) -> None:
        """Forget a request's own trie; a finished one's output joins the cached outputs (a
        preempted one is still running and will be drafted for again)."""
        self.requests.pop(request.request_id, None)
        if request.finished:
            self.cached.add(request.output_token_ids)

    def clear_history(self) -> None:
        """Forget every cached output (benchmarks start each pass over a prompt set cold)."""
        self.cached.clear()

    def _own_trie(self, request: TokenHistory) -> SuffixTrie:
        """The request's trie, extended with the tokens it received since the last step."""
        trie = self.requests.get(request.request_id)
        if trie is None:
            trie = self.requests[request.request_id] = SuffixTrie(self.config.max_tree_depth)
            trie.extend(0, request.prompt_token_ids)
        known = len(trie.sequence(0)) - len(request.prompt_token_ids)
        trie.extend(0, request.output_token_ids[known:])
        return trie
