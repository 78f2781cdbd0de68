"""Adaptive speculation: each step, how many tokens to draft for each decoding request (0 = none)
so that the expected number of tokens emitted per second of step time is highest, from a cost
model of this engine on this machine and each request's running acceptance estimate.

Speculation is a latency optimisation: one request alone gains from every accepted draft,
but a full batch already keeps the hardware busy, and drafts then only add work to the step.
The cost model says where that happens on this machine, so under load the policy turns
speculation down and off by itself (docs/design.md, 10).

- **Cost** (spec/cost.py, MeasuredStepCost): step seconds = target(new tokens in the forward) +
  draft(depth drafted). Target time is profiled at start-up (spec/profiles.py: forwards of 1,
  2, 4, ... tokens) and then learned online per token count (median of the last WINDOW steps,
  robust to a step slowed by something else on the machine; linear interpolation between
  measured counts, never falling as the count grows); draft time per depth is learned likewise
  (0 until measured: optimistic, so it gets measured). A drafting step's prediction is then
  scaled by how much longer recent drafting steps took than predicted, relative to plain ones
  (MeasuredStepCost.drafting_factor).
- **Gain** (spec/cost.py, expected_accepted): a chain request drafting d tokens with per-token
  acceptance a (geometric model) expects a (1 - a^d) / (1 - a) accepted drafts; a is its own
  accepted / (accepted + rejections) shrunk towards the engine-wide value (a prior worth
  PRIOR_WEIGHT verify steps).
  A tree's node budget is chosen the same way (its drafters cut trees to any budget, keeping
  their best nodes): every tree step that stops short of its budget counts as a rejection, so
  a = m / (m + 1) for m accepted per step, which is the chain that would accept as much; a
  small budget (a short chain of the best nodes) then competes with the full tree on cost.
- **Choice** (choose_num_drafts): the best common depth, then each request whose drafts add
  fewer tokens than their share of the step's extra time would have produced drops to 0.
  When the choice is no drafts at all, a step drafts anyway once in explore_interval(n) such
  steps (n decoding requests: 16 n steps, so exploring costs every request the same share of
  its steps at any load; at most 512), so the estimates and costs stay current.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from verispec.spec.cost import MeasuredStepCost, expected_accepted

PRIOR_WEIGHT = 4.0
"""Verify steps' worth of weight the engine-wide acceptance has in a request's estimate."""
EXPLORE_PER_REQUEST = 16
"""Steps per decoding request that would draft nothing pass before one drafts anyway."""
EXPLORE_EVERY = 512
"""... but never more than this many (load that falls shortens the wait at once)."""


def explore_interval(num_requests: int) -> int:
    """Idle steps between exploring ones: an exploring step drafts for every request, so its
    cost grows with their number, and the wait grows with it: each request spends the same
    share of its steps exploring at any load (a 32-request step explores about every 90 s on
    this project's CPU).

    >>> [explore_interval(n) for n in (1, 2, 4, 32, 64)]
    [16, 32, 64, 512, 512]
    """
    return max(1, min(EXPLORE_EVERY, EXPLORE_PER_REQUEST * num_requests))


MARGIN = 0.03
"""Drafts must promise this much more throughput than none: speculation has costs the model
leaves out (tree building, verification of more rows), so a near tie goes to no drafts."""


def choose_num_drafts(
    accepted: Sequence[Sequence[float]],
    depths: Sequence[int],
    base_tokens: int,
    step_seconds: Callable[[int, int], float],
    margin: float = 0.0,
    free_tokens: int = 0,
) -> list[int]:
    """Per request, the number of drafts (one of depths, which starts at 0) that maximises
    expected emitted tokens per second of step time; drafting at all must beat no drafts by
    the fraction `margin`.

    accepted[i][j]: request i's expected accepted drafts when it drafts depths[j] tokens;
    base_tokens: new tokens in the forward besides drafts (one per decoding request, plus
    prefill chunks); step_seconds(tokens, depth): the step's time with `tokens` in the target
    forward and `depth` positions drafted. Each decoding request emits 1 + accepted tokens;
    free_tokens more come whatever the choice (grammar-forced drafts, counted in base_tokens).

    Worked example: two requests, one predictable (a = 0.9), one not (0.1), depths [0, 1, 2],
    a step costing 1 s + 0.1 s per token + 0.2 s per draft position, 2 base tokens:
    depth 2 for both gives (2 + 1.71 + 0.11) / (1 + 0.6 + 0.4) = 1.91 tokens/s against
    2 / 1.2 = 1.67 without drafts; the second request's two drafts add 0.11 tokens for 0.2 s,
    less than the 0.38 tokens that time is worth at that rate, so it drafts none.

    >>> acc = [[0, 0.9, 1.71], [0, 0.1, 0.11]]
    >>> choose_num_drafts(acc, [0, 1, 2], 2, lambda t, d: 1 + 0.1 * t + 0.2 * d)
    [2, 0]
    """
    n = len(accepted)
    if n == 0:
        return []

    def rate(ks: Sequence[int], js: Sequence[int]) -> float:
        emitted = n + free_tokens + sum(accepted[i][j] for i, j in enumerate(js))
        return emitted / step_seconds(base_tokens + sum(ks), max(ks, default=0))

    best_j = max(range(len(depths)), key=lambda j: rate([depths[j]] * n, [j] * n))
    depth = depths[best_j]
    ks, js = [depth] * n, [best_j] * n
    if depth == 0 or rate(ks, js) < (1 + margin) * rate([0] * n, [0] * n):
        return [0] * n
    r = rate(ks, js)
    per_token = (step_seconds(base_tokens + depth * n, depth)
                 - step_seconds(base_tokens + depth * (n - 1), depth)) / depth  # fmt: skip
    for i in range(n):  # a request whose drafts are worth less than the time they take
        if accepted[i][best_j] < r * per_token * depth:
            ks[i], js[i] = 0, 0
    if not any(ks):
        return ks
    return ks if rate(ks, js) >= rate([depth] * n, [best_j] * n) else [depth] * n


@dataclass
class _Counts:
    accepted: int = 0
    rejections: int = 0
    steps: int = 0


class AdaptiveSpeculation:
    """Chooses each decoding request's draft count each step (see the module docstring)."""

    def __init__(self, max_tokens: int, cost: MeasuredStepCost | None = None) -> None:
        self.max_tokens = max_tokens
        self.depths = list(range(max_tokens + 1))
        self.cost = cost or MeasuredStepCost()
        self._requests: dict[str, _Counts] = {}
        self._total = _Counts()
        self._idle_steps = 0
        self.last_choice: list[int] = []
        """The draft counts chosen at the last step (for metrics)."""

    def choose(self, request_ids: Sequence[str], base_tokens: int,
               free_tokens: int = 0) -> list[int]:  # fmt: skip
        """Draft counts for the decoding requests (before the scheduler's own limits); the
        step emits free_tokens more whatever they are (choose_num_drafts)."""
        accepted = [self._gains(self._requests.get(r, _Counts())) for r in request_ids]
        ks = choose_num_drafts(accepted, self.depths, base_tokens, self.cost.seconds, MARGIN,
                               free_tokens)  # fmt: skip
        if request_ids and not any(ks):
            self._idle_steps += 1
            if self._idle_steps >= explore_interval(len(request_ids)):
                self._idle_steps = 0
                ks = [self.depths[1]] * len(request_ids)
        self.last_choice = ks
        return ks

    def observe_request(self, request_id: str, num_drafts: int, num_accepted: int) -> None:
        """Count one verify step of a request (num_drafts > 0)."""
        if num_drafts <= 0:
            return
        rejected = int(num_accepted < num_drafts)
        for counts in (self._requests.setdefault(request_id, _Counts()), self._total):
            counts.accepted += num_accepted
            counts.rejections += rejected
            counts.steps += 1

    def release(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def _gains(self, counts: _Counts) -> list[float]:
        total = self._total
        seen = total.accepted + total.rejections
        prior = total.accepted / seen if seen else 0.5
        alpha = (counts.accepted + PRIOR_WEIGHT * prior) / (
            counts.accepted + counts.rejections + PRIOR_WEIGHT
        )
        return [expected_accepted(alpha, d) for d in self.depths]
