"""Model-free drafters replayed on a target's recorded greedy outputs: tokens per step, no model.

At temperature 0 the output is the target's own whatever the drafts (docs/design.md, 3), so how
many tokens a drafter would gain each step follows from the recorded plain output alone: at
each step the drafter proposes from the context so far, the longest root path of its tree that
agrees with the recorded continuation is accepted, and the target's step adds one token more.
This scores prompt lookup and suffix decoding on a prompt set in seconds, and bounds what any
drafter that copies from its context can gain (copy_bound), so that a speedup goal can be
checked against what the workload allows before timing anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from verispec.engine.drafter import Proposer
from verispec.engine.request import Request
from verispec.sample.tree import DraftTree


@dataclass(frozen=True, slots=True)
class Recorded:
    """One request as plain greedy decoding ran it: prompt ids and every output id."""

    prompt: list[int]
    output: list[int]


@dataclass(slots=True)
class ReplayStats:
    """Counts over a replay: target steps after the prefill and what they emitted."""

    steps: int = 0  # target steps after each request's prefill (each emits accepted + 1)
    tokens: int = 0  # output tokens after each request's first (the prefill's)
    verify_steps: int = 0  # steps that had drafts to verify
    accepted: int = 0  # draft tokens accepted in them
    nodes: int = 0  # draft tokens (tree nodes) verified in them

    @property
    def tokens_per_step(self) -> float:
        """Output tokens per target step: the decode speedup if a step cost what a plain one
        does (its ceiling)."""
        return self.tokens / max(1, self.steps)

    @property
    def mean_length(self) -> float:
        """1 + accepted drafts per verify step (the bench's "len")."""
        return 1 + self.accepted / max(1, self.verify_steps)

    @property
    def nodes_per_verify(self) -> float:
        return self.nodes / max(1, self.verify_steps)

    def add_step(self, drafted: int, accepted: int, emitted: int) -> None:
        self.steps += 1
        self.tokens += emitted
        if drafted:
            self.verify_steps += 1
            self.accepted += accepted
            self.nodes += drafted


def greedy_accepted(tree: DraftTree, truth: Sequence[int]) -> int:
    """Drafts greedy verification keeps: the longest root path of tree agreeing with truth, the
    target's next tokens. E.g. tokens [5, 7, 2, 9], parents [-1, -1, 0, 0], truth [5, 9, 4]: 2
    (5, then its child 9)."""
    kids: dict[int, dict[int, int]] = {}
    for node, (token, parent) in enumerate(zip(tree.token_ids, tree.parents, strict=True)):
        kids.setdefault(parent, {}).setdefault(token, node)  # first of equal siblings
    node, n = -1, 0
    while n < len(truth) and truth[n] in kids.get(node, {}):
        node, n = kids[node][truth[n]], n + 1
    return n


@dataclass(slots=True)
class _Replayed:
    """What a model-free drafter reads of a request (Request's fields of the same names)."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    finished: bool = False

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids


def replay(proposer: Proposer, recorded: Sequence[Recorded], k: int) -> ReplayStats:
    """Replays each request in turn (one at a time, as a bench pass at concurrency 1): the
    prefill emits its first output token, then every step drafts up to k tokens (no more than
    the output has left), keeps greedy_accepted of them and emits one more; a finished request
    is released, so a drafter that learns from earlier outputs (suffix) sees them."""
    stats = ReplayStats()
    for i, rec in enumerate(recorded):
        req = _Replayed(f"replay-{i}", list(rec.prompt), list(rec.output[:1]))
        as_request = cast(Request, req)
        while len(req.output_token_ids) < len(rec.output):
            done = len(req.output_token_ids)
            budget = min(k, len(rec.output) - done - 1)
            drafts = proposer.propose([as_request], [budget])
            tree = drafts.trees[0] if drafts.trees else DraftTree.chain(drafts.token_ids[0])
            truth = rec.output[done:]
            accepted = min(greedy_accepted(tree, truth), len(truth) - 1)
            req.output_token_ids += truth[: accepted + 1]
            stats.add_step(tree.num_nodes, accepted, accepted + 1)
        req.finished = True
        proposer.release(as_request)
    return stats


def copy_bound(recorded: Sequence[Recorded], k: int, min_match: int = 1) -> ReplayStats:
    """A bound for drafters that copy from what they have seen: each step drafts, knowing the
    answer, the continuation (up to k tokens) after whichever earlier occurrence of the
    context's last min_match tokens agrees longest with the output, searching the request's
    prompt and output so far and earlier requests' outputs. No drafter choosing among those
    occurrences without the answer does better, whatever its tree. E.g. context [1, 2, 1],
    output continuing [3, 4], min_match 1: the 1 at position 0 is followed by 2, the 1 at
    position 2 by nothing yet, so 0 accepted."""
    stats = ReplayStats()
    finished: list[list[int]] = []
    for rec in recorded:
        done = 1
        while done < len(rec.output):
            context = rec.prompt + rec.output[:done]
            truth = rec.output[done:]
            cap = min(k, len(truth) - 1)
            tail = context[-min_match:]
            best = 0
            for seen in (context, *finished):
                for j in range(len(seen) - min_match):
                    if seen[j : j + min_match] != tail:
                        continue
                    n, after = 0, j + min_match
                    while n < cap and after + n < len(seen) and seen[after + n] == truth[n]:
                        n += 1
                    best = max(best, n)
            stats.add_step(best, best, best + 1)
            done += best + 1
        finished.append(rec.output)
    return stats


def end_to_end_ceiling(tokens_per_step: float, prefill_s: float, decode_s: float) -> float:
    """End-to-end speedup over plain decoding if every step emitted tokens_per_step tokens at a
    plain step's cost: (prefill + decode) / (prefill + decode / tokens_per_step). E.g. prefill
    0.25 s, decode 1 s, 3 tokens a step: 1.25 / (0.25 + 0.333) = 2.14."""
    return (prefill_s + decode_s) / (prefill_s + decode_s / tokens_per_step)
