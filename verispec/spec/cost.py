"""The model of what speculation gains and what it costs, shared by the adaptive policy
(spec/policy.py), self-speculation's calibration (drafters/skip_search.py) and the benchmarks
(bench/verify_cost.py, bench/harness.py).

- **Acceptance** (geometric): each draft is accepted with probability a given the ones before
  were, so a chain of k drafts expects expected_accepted(a, k) = a (1 - a^k) / (1 - a) of them
  and a verify step emits tokens_per_step(a, k) = 1 + that; alpha_from_length inverts it for a
  measured mean acceptance length.
- **Step cost, relative** (speedup, RelativeStepCost): in plain decode steps (a 1-token target
  forward = 1), a step of k drafts costs k draft steps plus one verify forward of k + 1 tokens,
  1 + verify_per_token k; the speedup over plain decoding is the tokens it emits over that.
  Leviathan et al.'s formula is verify_per_token = 0; the calibration prices a draft step by
  the share of the target's weights it reads.
- **Step cost, measured** (MeasuredStepCost): seconds of one of this engine's steps by new tokens in
  the target forward and draft depth, profiled at start-up (spec/profiles.py) and learned from
  the steps served, which the adaptive policy compares its choices with.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verispec.models.llama import LlamaModel

WINDOW = 9
"""Recent measurements per token count (or depth) whose median is the cost model's estimate."""
MIN_STEPS = 3
"""Measured steps a token count needs before its own estimate replaces the scaled profile."""
CHECK_WINDOW = 16
"""Recent decode steps, drafting and not, whose measured / predicted times calibrate drafts."""
VERIFY_COST_PER_TOKEN = 0.1
"""A verify forward of k + 1 tokens costs 1 + VERIFY_COST_PER_TOKEN k decode steps (fitted to
SmolLM2-135M's measured verify costs on a 2-core CPU: docs/benchmarks.md)."""


def expected_accepted(alpha: float, depth: int) -> float:
    """Expected accepted drafts of a chain of `depth` tokens, each accepted with probability
    alpha given the previous one was.

    >>> round(expected_accepted(0.5, 2), 3), expected_accepted(1.0, 3), expected_accepted(0.9, 0)
    (0.75, 3.0, 0.0)
    """
    if alpha >= 1.0:
        return float(depth)
    return alpha * (1 - alpha**depth) / (1 - alpha)


def tokens_per_step(a: float, k: int) -> float:
    """Expected tokens per verify step of k drafts: the accepted ones and the token the target
    adds, 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a).

    >>> tokens_per_step(0.5, 2), tokens_per_step(1.0, 4)
    (1.75, 5.0)
    """
    return 1 + expected_accepted(a, k)


def alpha_from_length(length: float | None, k: int) -> float | None:
    """The a for which tokens_per_step(a, k) equals a measured mean acceptance length (by
    bisection: tokens_per_step rises from 1 at a = 0 to k + 1 at a = 1).

    >>> round(alpha_from_length(1.75, 2), 6), alpha_from_length(None, 2)
    (0.5, None)
    """
    if length is None:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tokens_per_step(mid, k) < length else (lo, mid)
    return (lo + hi) / 2


def speedup(accepted: float, k: int, draft: float, verify_per_token: float = 0.0) -> float:
    """Expected tokens per unit of time against plain decoding (one token per decode step) of
    steps that draft k tokens at `draft` decode steps each, verify them in one forward costing
    1 + verify_per_token k decode steps, and emit 1 + accepted tokens.

    Leviathan et al. (2023), eq. 1, with a = 0.5, k = 2 and a draft costing c = 0.25 of the
    target: 1.75 / 1.5; a draft of 0.6 with verification at 0.1 a token: 2.5 / 2.4.

    >>> round(speedup(expected_accepted(0.5, 2), 2, 0.25), 4), round(speedup(1.5, 2, 0.6, 0.1), 4)
    (1.1667, 1.0417)
    """
    return (1 + accepted) / (k * draft + 1 + verify_per_token * k)


def predicted_speedup(a: float | None, k: int, c: float) -> float | None:
    """Leviathan et al. (2023), eq. 1: (1 - a^(k+1)) / ((1 - a)(k c + 1)), with c the draft's
    cost per token relative to the target's (None when a is). E.g. a = 0.5, k = 2, c = 0.25:
    1.75 / 1.5."""
    if a is None:
        return None
    return speedup(expected_accepted(a, k), k, c)


@dataclass(frozen=True, slots=True)
class RelativeStepCost:
    """Step costs in target decode steps of a draft that runs `kept` of the target's num_layers
    layers: a draft step costs fixed + (1 - fixed) kept / num_layers, where fixed is the share
    of the weights outside the layers (the LM head, which every draft step still runs):
    decoding reads every weight once per step. A verify forward of k + 1 tokens costs
    1 + verify_per_token * k."""

    fixed: float
    num_layers: int
    verify_per_token: float = VERIFY_COST_PER_TOKEN

    @classmethod
    def of(cls, model: LlamaModel) -> RelativeStepCost:
        """The model's weight shares: LM head (the last of model.linears()) against all."""
        sizes = [lin.out_features * lin.in_features for lin in model.linears()]
        return cls(sizes[-1] / sum(sizes), len(model.layers))

    def draft(self, kept: int) -> float:
        """One draft step's cost when it keeps `kept` layers.

        >>> round(RelativeStepCost(fixed=0.2, num_layers=10).draft(5), 6)
        0.6
        """
        return self.fixed + (1 - self.fixed) * kept / self.num_layers

    def speedup(self, accepted: float, k: int, kept: int) -> float:
        """Expected tokens per unit of time against plain decoding (1 token per decode step)."""
        return speedup(accepted, k, self.draft(kept), self.verify_per_token)


@dataclass
class MeasuredStepCost:
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

        >>> cost = MeasuredStepCost(profile={8: 0.1, 16: 0.12}, draft={1: 0.01})
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

        >>> MeasuredStepCost(target={4: 0.2}, profile={4: 0.1, 8: 0.15}).curve()
        {4: 0.2, 8: 0.3}
        >>> MeasuredStepCost(target={4: 0.2, 8: 0.1}).curve()  # never cheaper for more tokens
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
