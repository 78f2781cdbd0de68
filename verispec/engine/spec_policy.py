"""Adaptive speculation: each step, how many tokens to draft for each decoding request (0 = none)
so that the expected number of tokens emitted per second of step time is highest, from a cost
model of this engine on this machine and each request's running acceptance estimate.

Speculation is a latency optimisation: one request alone gains from every accepted draft,
but a full batch already keeps the hardware busy, and drafts then only add work to the step.
The cost model says where that happens on this machine, so under load the policy turns
speculation down and off by itself (docs/design.md, 10).

- **Cost**: step seconds = target(new tokens in the forward) + draft(depth drafted). Target
  time is profiled at start-up (forwards of 1, 2, 4, ... tokens) and then learned online per
  token count (median of the last WINDOW steps, robust to a step slowed by something else on
  the machine; linear interpolation between measured counts, never falling as the count
  grows); draft time per depth is learned likewise (0 until measured: optimistic, so it gets
  measured). A drafting step's prediction is then scaled by how much longer recent drafting
  steps took than predicted, relative to plain ones (StepCost.drafting_factor).
- **Gain**: a chain request drafting d tokens with per-token acceptance a (geometric model)
  expects a (1 - a^d) / (1 - a) accepted drafts; a is its own accepted / (accepted +
  rejections) shrunk towards the engine-wide value (a prior worth PRIOR_WEIGHT verify steps).
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

import bisect
import itertools
import math
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

PRIOR_WEIGHT = 4.0
"""Verify steps' worth of weight the engine-wide acceptance has in a request's estimate."""
EXPLORE_PER_REQUEST = 16
"""Steps per decoding request that would draft nothing pass before one drafts anyway."""
EXPLORE_EVERY = 512
"""... but never more than this many (load that falls shortens the wait at once)."""
WINDOW = 9
"""Recent measurements per token count (or depth) whose median is the cost model's estimate."""
MIN_STEPS = 3
"""Measured steps a token count needs before its own estimate replaces the scaled profile."""
CHECK_WINDOW = 16
"""Recent decode steps, drafting and not, whose measured / predicted times calibrate drafts."""


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


def expected_accepted(alpha: float, depth: int) -> float:
    """Expected accepted drafts of a chain of `depth` tokens, each accepted with probability
    alpha given the previous one was.

    >>> round(expected_accepted(0.5, 2), 3), expected_accepted(1.0, 3), expected_accepted(0.9, 0)
    (0.75, 3.0, 0.0)
    """
    if alpha >= 1.0:
        return float(depth)
    return alpha * (1 - alpha**depth) / (1 - alpha)


def choose_num_drafts(
    accepted: Sequence[Sequence[float]],
    depths: Sequence[int],
    base_tokens: int,
    step_seconds: Callable[[int, int], float],
    margin: float = 0.0,
) -> list[int]:
    """Per request, the number of drafts (one of depths, which starts at 0) that maximises
    expected emitted tokens per second of step time; drafting at all must beat no drafts by
    the fraction `margin`.

    accepted[i][j]: request i's expected accepted drafts when it drafts depths[j] tokens;
    base_tokens: new tokens in the forward besides drafts (one per decoding request, plus
    prefill chunks); step_seconds(tokens, depth): the step's time with `tokens` in the target
    forward and `depth` positions drafted. Each decoding request emits 1 + accepted tokens.

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
        emitted = n + sum(accepted[i][j] for i, j in enumerate(js))
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
class StepCost:
    """Seconds of an engine step, by new tokens in the target forward and by draft depth.

    The start-up profile (one short sequence) is cheaper than serving steps (many sequences,
    long contexts), so once steps are measured, profile points stand in where fewer than
    MIN_STEPS steps were measured, each scaled by the median measured / profiled ratio of the
    recent steps near it (token counts from that profile point to the next; the nearest such
    range with MIN_STEPS steps where it has too few): a step of many sequences costs more per
    extra token than the profile's one sequence, so one scale for every count made drafts look
    cheap at 16 clients.
    """

    target: dict[int, float] = field(default_factory=dict)
    """Measured step seconds (besides drafting) by token count (moving averages)."""
    draft: dict[int, float] = field(default_factory=dict)
    """Measured draft seconds by depth."""
    profile: dict[int, float] = field(default_factory=dict)
    """Target forward seconds by token count, timed at start-up."""
    _merged: dict[int, float] = field(default_factory=dict, repr=False)
    _recent: dict[tuple[str, int], deque[float]] = field(default_factory=dict, repr=False)
    _ratios: dict[int, deque[float]] = field(default_factory=dict, repr=False)
    """Recent measured / profiled ratios by the profile point at or below their token count."""
    _checks: dict[bool, deque[float]] = field(default_factory=dict, repr=False)
    """Recent decode steps' measured / predicted seconds, by whether they drafted."""

    def observe(self, tokens: int | None, depth: int, target_s: float, draft_s: float) -> None:
        """Fold one step's measured times in (tokens None: a step whose target time does not
        count, e.g. one with prefill chunks; its draft time still does)."""
        if tokens is not None:
            predicted = self.predicted(tokens, depth)
            if predicted > 0:
                checks = self._checks.setdefault(depth > 0, deque(maxlen=CHECK_WINDOW))
                checks.append((target_s + draft_s) / predicted)
            self._update(self.target, "target", tokens, target_s)
            if self.profile:
                ratio = target_s / _interpolate(self.profile, tokens)
                below = [k for k in self.profile if k <= tokens]
                point = max(below) if below else min(self.profile)
                self._ratios.setdefault(point, deque(maxlen=WINDOW)).append(ratio)
        if depth > 0:
            self._update(self.draft, "draft", depth, draft_s)
        self._merged = {}

    def _update(self, table: dict[int, float], name: str, key: int, value: float) -> None:
        """table[key]: the median of key's last WINDOW measurements."""
        recent = self._recent.setdefault((name, key), deque(maxlen=WINDOW))
        recent.append(value)
        table[key] = statistics.median(recent)

    def seconds(self, tokens: int, depth: int) -> float:
        """Predicted step seconds, a drafting step's corrected by drafting_factor()."""
        predicted = self.predicted(tokens, depth)
        return predicted * self.drafting_factor() if depth > 0 else predicted

    def predicted(self, tokens: int, depth: int) -> float:
        """Step seconds from the target curve and the draft times alone."""
        return _interpolate(self.curve(), tokens) + (
            _interpolate(self.draft, depth) if depth > 0 and self.draft else 0.0
        )

    def drafting_factor(self) -> float:
        """How much longer recent drafting decode steps took than predicted, relative to
        plain ones (mean measured / predicted, 1.0 until each kind has MIN_STEPS steps).

        It charges drafts with what the curve and the draft times miss: a head catching up on
        the positions a request computed while it did not draft (its prompt, or every step
        since the last draft), verify rows that cost more than the curve's scaled profile
        says. Means, not medians: a catch-up is a rare slow step, and a real cost.

        Drafting steps of 16 tokens as predicted (0.12 s target, 0.01 s draft), but one in
        three catches up and drafts for 0.1 s, which the median draft time leaves out:

        >>> cost = StepCost(profile={8: 0.1, 16: 0.12}, draft={1: 0.01})
        >>> for draft_s in (0.01, 0.01, 0.1):
        ...     cost.observe(8, 0, 0.1, 0.0)
        ...     cost.observe(16, 1, 0.12, draft_s)
        >>> round(cost.drafting_factor(), 3), round(cost.seconds(16, 1), 3)
        (1.231, 0.16)
        """
        drafted, plain = self._checks.get(True, ()), self._checks.get(False, ())
        if len(drafted) < MIN_STEPS or len(plain) < MIN_STEPS:
            return 1.0
        return statistics.fmean(drafted) / statistics.fmean(plain)

    def curve(self) -> dict[int, float]:
        """Target seconds by token count: measured steps, and the profile scaled to them.

        >>> StepCost(target={4: 0.2}, profile={4: 0.1, 8: 0.15}).curve()
        {4: 0.2, 8: 0.3}
        >>> StepCost(target={4: 0.2, 8: 0.1}).curve()  # never cheaper for more tokens
        {4: 0.2, 8: 0.2}
        """
        if not self._merged:
            trusted = {k: t for k, t in self.target.items() if self._trusted(k)}
            fallback = 1.0
            if not self._ratios and trusted and self.profile:
                ratios = [t / _interpolate(self.profile, k) for k, t in trusted.items()]
                fallback = sum(ratios) / len(ratios)
            scaled = {k: v * self._scale(k, fallback) for k, v in self.profile.items()
                      if k not in trusted}  # fmt: skip
            merged = {**scaled, **trusted} or dict(self.target)
            # More tokens never cost less: ranges scaled by different ratios (or noise) can
            # otherwise make a step with drafts look cheaper than the same step without.
            counts = sorted(merged)
            self._merged = dict(zip(counts, itertools.accumulate(
                (merged[k] for k in counts), max), strict=True))  # fmt: skip
        return self._merged

    def _scale(self, point: int, fallback: float) -> float:
        """The median measured / profiled ratio near a profile point: its own range's when
        that has MIN_STEPS steps, else the nearest range's that has (any steps at all, when
        none has enough), else fallback."""
        ranges = [k for k, r in self._ratios.items() if r]
        if not ranges:
            return fallback
        enough = [k for k in ranges if len(self._ratios[k]) >= MIN_STEPS] or ranges
        nearest = min(enough, key=lambda k: (abs(math.log2(k) - math.log2(point)), -k))
        return statistics.median(self._ratios[nearest])

    def _trusted(self, tokens: int) -> bool:
        """Whether the measured estimate at this token count rests on enough steps (or was
        given, not measured)."""
        recent = self._recent.get(("target", tokens))
        return recent is None or len(recent) >= MIN_STEPS


def _interpolate(table: dict[int, float], x: int) -> float:
    """Piecewise-linear through the measured points, extended by the end segments' slopes.

    >>> _interpolate({1: 1.0, 3: 2.0}, 2), _interpolate({1: 1.0, 3: 2.0}, 5), _interpolate({}, 4)
    (1.5, 3.0, 0.0)
    """
    if not table:
        return 0.0
    xs = sorted(table)
    if x in table:
        return table[x]
    if len(xs) == 1:
        return table[xs[0]] * x / xs[0]
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1 = xs[i - 1], xs[i]
    y0, y1 = table[x0], table[x1]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass
class _Counts:
    accepted: int = 0
    rejections: int = 0
    steps: int = 0


class AdaptiveSpeculation:
    """Chooses each decoding request's draft count each step (see the module docstring)."""

    def __init__(self, max_tokens: int, cost: StepCost | None = None) -> None:
        self.max_tokens = max_tokens
        self.depths = list(range(max_tokens + 1))
        self.cost = cost or StepCost()
        self._requests: dict[str, _Counts] = {}
        self._total = _Counts()
        self._idle_steps = 0
        self.last_choice: list[int] = []
        """The draft counts chosen at the last step (for metrics)."""

    def choose(self, request_ids: Sequence[str], base_tokens: int) -> list[int]:
        """Draft counts for the decoding requests (before the scheduler's own limits)."""
        accepted = [self._gains(self._requests.get(r, _Counts())) for r in request_ids]
        ks = choose_num_drafts(accepted, self.depths, base_tokens, self.cost.seconds, MARGIN)
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
