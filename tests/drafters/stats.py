"""Goodness-of-fit statistics for the sampling-distribution tests, without scipy.

- Pearson's chi-square with small cells pooled, and its p-value from the regularized upper
  incomplete gamma function: P(chi2_dof > x) = Q(dof / 2, x / 2).
- Total variation distance, and a bound on it that a correct sampler exceeds with probability
  at most delta (derivation in `tv_bound`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MIN_EXPECTED = 5.0
"""Cells with fewer expected samples are pooled, the usual rule for the chi-square approximation."""


def gamma_q(a: float, x: float) -> float:
    """Regularized upper incomplete gamma Q(a, x) = Gamma(a, x) / Gamma(a), a > 0, x >= 0.

    The series for P(a, x) converges fast for x < a + 1, the continued fraction for Q(a, x)
    (modified Lentz) elsewhere, as in Numerical Recipes' gammq; both to ~1e-15 relative.
    """
    if a <= 0 or x < 0:
        raise ValueError(f"need a > 0 and x >= 0, got a={a}, x={x}")
    if x == 0:
        return 1.0
    log_prefactor = a * math.log(x) - x - math.lgamma(a)  # log(x^a e^-x / Gamma(a))
    if x < a + 1:
        term = total = 1.0 / a  # P(a, x) = prefactor * sum_n x^n / (a (a+1) ... (a+n))
        n = 0
        while abs(term) > abs(total) * 1e-16 and n < 10_000:
            n += 1
            term *= x / (a + n)
            total += term
        return max(0.0, 1.0 - total * math.exp(log_prefactor))
    tiny = 1e-300
    b = x + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        step = d * c
        h *= step
        if abs(step - 1) < 1e-16:
            break
    return math.exp(log_prefactor) * h


def chi2_sf(x: float, dof: int) -> float:
    """P(X > x) for X ~ chi-square with dof degrees of freedom (the test's p-value)."""
    return gamma_q(dof / 2, x / 2)


@dataclass(frozen=True)
class Fit:
    """How well counts over cells match exact cell probabilities."""

    n: int
    """Samples."""
    chi2: float
    """Pearson's statistic over the pooled cells."""
    dof: int
    p_value: float
    tv: float
    """Total variation distance between the empirical and exact distribution (all cells)."""
    tv_bound: float
    """What tv stays below with probability >= 1 - TV_DELTA when the sampler is exact."""
    impossible: int
    """Samples that landed in cells of probability exactly 0."""

    def ok(self, alpha: float) -> bool:
        return self.p_value > alpha and self.tv <= self.tv_bound and self.impossible == 0

    def __str__(self) -> str:
        return (
            f"n={self.n} chi2={self.chi2:.1f} dof={self.dof} p={self.p_value:.3g} "
            f"tv={self.tv:.4f} (bound {self.tv_bound:.4f}) impossible={self.impossible}"
        )


TV_DELTA = 1e-6
"""Probability that an exact sampler's TV exceeds `tv_bound` (the bound is rigorous)."""


def tv_bound(probs: Sequence[float], n: int, delta: float = TV_DELTA) -> float:
    """A bound that TV(empirical of n i.i.d. draws, probs) exceeds with probability <= delta.

    Mean: with Y_i the fraction of draws in cell i (mean p_i, variance p_i (1 - p_i) / n),
    E|Y_i - p_i| <= min(sqrt(p_i (1 - p_i) / n), 2 p_i) (Jensen; and |Y - p| <= Y + p), so
    E[TV] <= m = 1/2 sum_i min(...) <= 1/2 sqrt(cells / n) by Cauchy-Schwarz.
    Deviation: one draw moves TV by at most 1/n, so McDiarmid gives
    P(TV >= m + t) <= exp(-2 n t^2); t = sqrt(ln(1 / delta) / (2 n)).
    Both terms shrink as 1/sqrt(n): the bound is c * sqrt(cells / n) with c <= 1/2 plus t.
    """
    mean = 0.5 * sum(min(math.sqrt(p * (1 - p) / n), 2 * p) for p in probs)
    return mean + math.sqrt(math.log(1 / delta) / (2 * n))


def pool(expected: Sequence[float], observed: Sequence[int]) -> tuple[list[float], list[int]]:
    """Cells with expected count >= MIN_EXPECTED kept; the rest summed into one cell, which is
    merged into the smallest kept cell when its own expected count is still below the rule."""
    keep = sorted(
        (i for i, e in enumerate(expected) if e >= MIN_EXPECTED), key=expected.__getitem__
    )
    rest = [i for i, e in enumerate(expected) if e < MIN_EXPECTED]
    exp_cells = [expected[i] for i in keep]
    obs_cells = [observed[i] for i in keep]
    rest_e, rest_o = sum(expected[i] for i in rest), sum(observed[i] for i in rest)
    if (rest and rest_e >= MIN_EXPECTED) or not exp_cells:
        exp_cells.append(rest_e)
        obs_cells.append(rest_o)
    elif rest:
        exp_cells[0] += rest_e
        obs_cells[0] += rest_o
    return exp_cells, obs_cells


def fit(probs: Sequence[float], counts: Sequence[int]) -> Fit:
    """Chi-square (pooled cells) and TV of counts against the exact distribution probs."""
    if len(probs) != len(counts):
        raise ValueError(f"{len(probs)} probabilities but {len(counts)} counts")
    n = sum(counts)
    total = math.fsum(probs)
    probs = [p / total for p in probs]  # float rounding of the exact product
    exp_cells, obs_cells = pool([p * n for p in probs], counts)
    chi2 = sum((o - e) ** 2 / e for e, o in zip(exp_cells, obs_cells, strict=True))
    dof = len(exp_cells) - 1
    return Fit(
        n=n,
        chi2=chi2,
        dof=dof,
        p_value=chi2_sf(chi2, dof) if dof > 0 else 1.0,
        tv=0.5 * sum(abs(c / n - p) for p, c in zip(probs, counts, strict=True)),
        tv_bound=tv_bound(probs, n),
        impossible=sum(c for p, c in zip(probs, counts, strict=True) if p == 0 and c > 0),
    )
