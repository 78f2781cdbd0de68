"""Goodness-of-fit statistics of `verispec verify` and the sampling tests, without scipy.

- Pearson's chi-square with small cells pooled, its p-value from the regularized upper
  incomplete gamma function: P(chi2_dof > x) = Q(dof / 2, x / 2).
- Total variation (TV) distance, and a bound on it that an exact sampler exceeds with
  probability at most delta (derivation in `tv_bound`).
- The same chi-square for two samples (is A drawn from the distribution B is drawn from?).

A distribution over a huge set of cells (pairs of tokens: 49152^2 for SmolLM2) is given as
`Block`s: rows whose cells are known one by one, and a remaining mass known only in total, in
which no sample fell. Pooling makes that enough for an exact test (`fit_blocks`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

MIN_EXPECTED = 5.0
"""Cells with fewer expected samples are pooled, the usual rule for the chi-square approximation."""
TV_DELTA = 1e-6
"""Default probability that an exact sampler's TV exceeds `tv_bound` (the bound is rigorous)."""


def gamma_q(a: float, x: float) -> float:
    """Regularized upper incomplete gamma Q(a, x) = Gamma(a, x) / Gamma(a), a > 0, x >= 0.

    The series for P(a, x) converges fast for x < a + 1, the continued fraction for Q(a, x)
    (modified Lentz) elsewhere, as in Numerical Recipes' gammq; both to ~1e-15 relative.

    >>> round(gamma_q(1.0, 2.0), 6)  # Q(1, x) = exp(-x)
    0.135335
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
    """P(X > x) for X ~ chi-square with dof degrees of freedom (the test's p-value).

    >>> round(chi2_sf(3.841, 1), 3)  # the upper 5% point of chi-square with 1 dof
    0.05
    """
    return gamma_q(dof / 2, x / 2)


def tv_bound(probs: Sequence[float], n: int, delta: float = TV_DELTA) -> float:
    """A bound that TV(empirical of n i.i.d. draws, probs) exceeds with probability <= delta.

    Mean: with Y_i the fraction of draws in cell i (mean p_i, variance p_i (1 - p_i) / n),
    E|Y_i - p_i| <= min(sqrt(p_i (1 - p_i) / n), 2 p_i) (Jensen; and |Y - p| <= Y + p), so
    E[TV] <= m = 1/2 sum_i min(...) <= 1/2 sqrt(cells / n) by Cauchy-Schwarz.
    Deviation: one draw moves TV by at most 1/n, so McDiarmid gives
    P(TV >= m + t) <= exp(-2 n t^2); t = sqrt(ln(1 / delta) / (2 n)).
    Both terms shrink as 1/sqrt(n): the bound is c * sqrt(cells / n) with c <= 1/2 plus t.

    >>> round(tv_bound([0.5, 0.5], 10_000), 4)  # 0.005 + 0.0263
    0.0313
    """
    return 0.5 * _mean_deviation(np.asarray(probs, dtype=np.float64), n) + _mcdiarmid(n, delta)


def _mean_deviation(probs: np.ndarray, n: int) -> float:
    """sum_i min(sqrt(p_i (1 - p_i) / n), 2 p_i): twice the bound on E[TV] of those cells."""
    return float(np.minimum(np.sqrt(probs * (1 - probs) / n), 2 * probs).sum())


def _mcdiarmid(n: int, delta: float) -> float:
    return math.sqrt(math.log(1 / delta) / (2 * n))


def pool(expected: Sequence[float], observed: Sequence[int]) -> tuple[list[float], list[int]]:
    """Cells with expected count >= MIN_EXPECTED kept; the rest summed into one cell, which is
    merged into the smallest kept cell when its own expected count is still below the rule.

    >>> pool([50.0, 30.0, 2.0, 1.0], [48, 33, 1, 1])
    ([33.0, 50.0], [35, 48])
    """
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


def pearson(exp_cells: Sequence[float], obs_cells: Sequence[int]) -> tuple[float, int, float]:
    """(chi2, dof, p-value) of observed against expected counts over already pooled cells.

    >>> chi2, dof, p = pearson([50.0, 50.0], [60, 40])
    >>> (chi2, dof, round(p, 4))
    (4.0, 1, 0.0455)
    """
    chi2 = sum((o - e) ** 2 / e for e, o in zip(exp_cells, obs_cells, strict=True))
    dof = len(exp_cells) - 1
    return chi2, dof, chi2_sf(chi2, dof) if dof > 0 else 1.0


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
    """What tv stays below with probability >= 1 - delta when the sampler is exact."""
    impossible: int
    """Samples that landed in cells of probability exactly 0."""

    def ok(self, alpha: float) -> bool:
        return self.p_value > alpha and self.tv <= self.tv_bound and self.impossible == 0

    def __str__(self) -> str:
        return (
            f"n={self.n} chi2={self.chi2:.1f} dof={self.dof} p={self.p_value:.3g} "
            f"tv={self.tv:.4f} (bound {self.tv_bound:.4f}) impossible={self.impossible}"
        )


@dataclass(frozen=True)
class Block:
    """Cells known one by one: their exact probabilities and the samples counted in each."""

    probs: np.ndarray  # [cells] float64
    counts: np.ndarray  # [cells] int64


def fit(probs: Sequence[float], counts: Sequence[int], delta: float = TV_DELTA) -> Fit:
    """Chi-square (pooled cells) and TV of counts against the exact distribution probs.

    >>> f = fit([0.5, 0.3, 0.2], [520, 290, 190])
    >>> (f.dof, round(f.p_value, 2), round(f.tv, 3), f.impossible)
    (2, 0.44, 0.02, 0)
    """
    if len(probs) != len(counts):
        raise ValueError(f"{len(probs)} probabilities but {len(counts)} counts")
    block = Block(np.asarray(probs, dtype=np.float64), np.asarray(counts, dtype=np.int64))
    return fit_blocks([block], 0.0, delta)


def fit_blocks(blocks: Sequence[Block], unresolved: float, delta: float = TV_DELTA) -> Fit:
    """`fit` of a distribution given as blocks of cells known one by one plus an `unresolved`
    mass of cells known only in total, which hold no samples and each have an expected count
    below MIN_EXPECTED (so pooling would sum them into the rest cell anyway: the test is the
    same as over every cell). TV counts the unresolved mass whole (no sample is there); the
    bound takes 2 p for its cells, the larger term of `tv_bound`'s minimum, so it stays
    rigorous. Probabilities are normalised to sum 1 (float rounding of exact products).

    Worked example: p(a) = 0.5 known, 0.5 spread over cells too small to resolve, 100 samples
    all in a: the rest cell expects 50 and got 0, chi2 = 2 * 50 = 100, TV = 0.5.

    >>> f = fit_blocks([Block(np.array([0.5]), np.array([100]))], 0.5)
    >>> (f.chi2, f.dof, f.tv)
    (100.0, 1, 0.5)
    """
    total = math.fsum(float(b.probs.sum()) for b in blocks) + unresolved
    n = int(sum(int(b.counts.sum()) for b in blocks))
    if n == 0 or total <= 0:
        raise ValueError("a fit needs at least one sample and a positive probability mass")
    kept_e: list[float] = []
    kept_o: list[int] = []
    rest_e, rest_o = unresolved / total * n, 0
    tv = unresolved / total
    deviation = 2 * unresolved / total
    impossible = 0
    for b in blocks:
        p = b.probs / total
        expected = p * n
        big = expected >= MIN_EXPECTED
        kept_e += expected[big].tolist()
        kept_o += b.counts[big].tolist()
        rest_e += float(expected[~big].sum())
        rest_o += int(b.counts[~big].sum())
        tv += float(np.abs(b.counts / n - p).sum())
        deviation += _mean_deviation(p, n)
        impossible += int(b.counts[p == 0].sum())
    exp_cells, obs_cells = pool([*kept_e, rest_e], [*kept_o, rest_o])
    chi2, dof, p_value = pearson(exp_cells, obs_cells)
    return Fit(n=n, chi2=chi2, dof=dof, p_value=p_value, tv=0.5 * tv,
               tv_bound=0.5 * deviation + _mcdiarmid(n, delta), impossible=impossible)  # fmt: skip


@dataclass(frozen=True)
class Comparison:
    """Two samples over the same cells: were they drawn from one distribution?"""

    n_a: int
    n_b: int
    chi2: float
    dof: int
    p_value: float
    tv: float
    """Total variation distance between the two empirical distributions."""
    tv_noise: float
    """What tv would stay below with probability >= 1 - delta if both followed the pooled
    empirical distribution (an estimate: the true one is unknown)."""

    def __str__(self) -> str:
        return (
            f"n={self.n_a}+{self.n_b} chi2={self.chi2:.1f} dof={self.dof} p={self.p_value:.3g} "
            f"tv={self.tv:.4f} (noise ~{self.tv_noise:.4f})"
        )


def compare(
    counts_a: Mapping[Hashable, int], counts_b: Mapping[Hashable, int], delta: float = TV_DELTA
) -> Comparison:
    """Pearson's chi-square test of homogeneity of two samples (a 2 x cells table): a cell's
    expected counts are each sample's size times the cell's pooled frequency; cells where
    either expectation is below MIN_EXPECTED are pooled into one, which joins the smallest
    kept cell when it is still below the rule; dof = cells - 1.

    TV's noise: E[TV(A, B)] <= E[TV(A, p)] + E[TV(B, p)], each bounded as in `tv_bound` with
    the pooled frequencies for p, plus McDiarmid's t for the two sizes (one draw of A moves TV
    by at most 1 / n_a): t = sqrt(ln(1 / delta) (1 / n_a + 1 / n_b) / 2).

    >>> c = compare({"x": 60, "y": 40}, {"x": 40, "y": 60})
    >>> (c.dof, round(c.chi2, 2), round(c.p_value, 4), round(c.tv, 3))
    (1, 8.0, 0.0047, 0.2)
    """
    n_a, n_b = sum(counts_a.values()), sum(counts_b.values())
    if n_a == 0 or n_b == 0:
        raise ValueError("both samples need at least one draw")
    cells = sorted(set(counts_a) | set(counts_b), key=repr)
    a = np.array([counts_a.get(c, 0) for c in cells], dtype=np.float64)
    b = np.array([counts_b.get(c, 0) for c in cells], dtype=np.float64)
    share = (a + b) / (n_a + n_b)  # [cells] pooled frequency
    big = np.minimum(share * n_a, share * n_b) >= MIN_EXPECTED
    order = np.argsort(share[big])  # smallest kept first
    rows = [(float(x), float(y), float(s)) for x, y, s in
            zip(a[big][order], b[big][order], share[big][order], strict=True)]  # fmt: skip
    rest = (float(a[~big].sum()), float(b[~big].sum()), float(share[~big].sum()))
    if (~big).any():
        if min(rest[2] * n_a, rest[2] * n_b) >= MIN_EXPECTED or not rows:
            rows.append(rest)
        else:
            x, y, s = rows[0]
            rows[0] = (x + rest[0], y + rest[1], s + rest[2])
    chi2 = sum((x - s * n_a) ** 2 / (s * n_a) + (y - s * n_b) ** 2 / (s * n_b)
               for x, y, s in rows)  # fmt: skip
    dof = len(rows) - 1
    deviation = _mean_deviation(share, n_a) + _mean_deviation(share, n_b)
    return Comparison(
        n_a=n_a, n_b=n_b, chi2=chi2, dof=dof, p_value=chi2_sf(chi2, dof) if dof > 0 else 1.0,
        tv=0.5 * float(np.abs(a / n_a - b / n_b).sum()),
        tv_noise=0.5 * deviation + math.sqrt(math.log(1 / delta) * (1 / n_a + 1 / n_b) / 2),
    )  # fmt: skip
