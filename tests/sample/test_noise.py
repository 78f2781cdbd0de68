"""The counter-based noise of seeded requests: a pure function of (seed, position, token id),
distinct across each of them, uniform and exponential by Kolmogorov-Smirnov tests, independent
across neighbouring seeds, positions and ids by chi-square tests of pairs, and the same on any
subset of ids; the module's worked example."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest
import torch

from verispec.audit.fit import chi2_sf
from verispec.sample import noise
from verispec.sample.noise import NoiseKey, exponentials, row_words, token_words, uniforms

ALPHA = 1e-4  # each test below fails a sound hash with probability about ALPHA


def ks_p_value(x: np.ndarray, cdf) -> float:
    """Kolmogorov-Smirnov test of the sample x against the continuous cdf: the asymptotic
    Kolmogorov p-value of D = sup |F_n - F| (Stephens' correction for finite n)."""
    x = np.sort(x)
    n = len(x)
    f = cdf(x)
    i = np.arange(1, n + 1)
    d = max(float((i / n - f).max()), float((f - (i - 1) / n).max()))
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    return min(1.0, 2 * sum((-1) ** (j - 1) * math.exp(-2 * j * j * lam * lam)
                            for j in range(1, 101)))  # fmt: skip


def pairs_p_value(u: np.ndarray, v: np.ndarray, bins: int = 10) -> float:
    """Chi-square test that the pairs (u_i, v_i) fall uniformly into bins x bins squares: u and
    v independent and uniform."""
    counts, _, _ = np.histogram2d(u, v, bins=bins, range=[[0, 1], [0, 1]])
    expected = len(u) / bins**2
    return chi2_sf(float(((counts - expected) ** 2 / expected).sum()), bins**2 - 1)


def words_of(keys: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """[n] and [n]: the row words a and b of each (seed, position)."""
    w = torch.tensor([row_words(s, t) for s, t in keys])  # [n, 2]
    return w[:, 0], w[:, 1]


def test_worked_example() -> None:
    assert doctest.testmod(noise).failed == 0


def test_a_pure_function_of_seed_position_and_id() -> None:
    ids = torch.tensor([0, 5, 49151, 2**31 - 1])
    first = exponentials(*row_words(7, 3), ids)
    assert torch.equal(first, exponentials(*row_words(7, 3), ids.clone()))
    assert torch.equal(first[1:3], exponentials(*row_words(7, 3), ids[1:3]))  # any subset
    assert torch.equal(first[[2, 0]], exponentials(*row_words(7, 3), ids[[2, 0]]))
    for other in (row_words(8, 3), row_words(7, 4), row_words(2**40 + 7, 3)):
        assert (exponentials(*other, ids) != first).all()
    assert NoiseKey(7, 1).shifted(2) == NoiseKey(7, 3)
    assert NoiseKey(7, 3).words() == row_words(7, 3)


def test_every_product_stays_below_2_to_the_63() -> None:
    """The largest word times the largest multiplier fits int64, so tensors and Python ints
    (exact) agree everywhere, the extremes of seed, position and id included."""
    assert (2**32 - 1) * max(noise._MULTIPLIERS) < 2**63
    for seed, position in [(0, 0), (2**64 - 1, 2**32 - 1), (2**63, 17), (12345, 2**31)]:
        a, b = row_words(seed, position)
        assert 0 <= a < 2**32 and 0 <= b < 2**32
        for token in (0, 1, 2**31 - 1, 2**32 - 1):
            m0, m1, m2, m3 = noise._MULTIPLIERS
            exact = noise._mix(noise._mix(token ^ a, m0, m1) ^ b, m2, m3)  # Python ints
            assert int(token_words(a, b, torch.tensor([token]))[0]) == exact


def test_distinct_ids_of_one_row_never_share_a_word() -> None:
    words = token_words(*row_words(3, 9), torch.arange(200_000))
    assert len(torch.unique(words)) == 200_000


def test_out_of_range_keys_are_value_errors() -> None:
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*64\), got -1"):
        row_words(-1, 0)
    with pytest.raises(ValueError, match=r"position must be in \[0, 2\*\*32\), got 4294967296"):
        row_words(0, 2**32)


def test_uniform_over_ids_and_exponential() -> None:
    u = uniforms(*row_words(0, 0), torch.arange(200_000)).numpy()
    assert 0 < u.min() and u.max() < 1
    assert ks_p_value(u, lambda x: x) > ALPHA
    e = exponentials(*row_words(1, 2), torch.arange(200_000)).numpy()
    assert e.min() > 0
    assert ks_p_value(e.astype(np.float64), lambda x: 1 - np.exp(-x)) > ALPHA


@pytest.mark.parametrize("token", [0, 5, 40_000])
def test_uniform_over_seeds_and_positions(token: int) -> None:
    n = 20_000
    for keys in ([(s, 3) for s in range(n)], [(11, t) for t in range(n)]):
        u = uniforms(*words_of(keys), torch.tensor(token)).numpy()
        assert ks_p_value(u, lambda x: x) > ALPHA


def test_neighbours_are_independent() -> None:
    """Pairs of noise values at consecutive seeds, consecutive positions and consecutive ids
    fill the unit square evenly."""
    n = 20_000
    seeds = uniforms(*words_of([(s, 0) for s in range(n + 1)]), torch.tensor(7)).numpy()
    assert pairs_p_value(seeds[:-1], seeds[1:]) > ALPHA
    positions = uniforms(*words_of([(5, t) for t in range(n + 1)]), torch.tensor(7)).numpy()
    assert pairs_p_value(positions[:-1], positions[1:]) > ALPHA
    ids = uniforms(*row_words(5, 0), torch.arange(2 * n)).numpy()
    assert pairs_p_value(ids[0::2], ids[1::2]) > ALPHA
    same_id = [uniforms(*words_of([(s, t) for s in range(n)]), torch.tensor(3)).numpy()
               for t in (0, 1)]  # fmt: skip
    assert pairs_p_value(*same_id) > ALPHA  # one seed's id 3 at positions 0 and 1


def test_races_with_consecutive_seeds_follow_p() -> None:
    """argmax(p / E) over seeds 0..n-1 at one position: each token about p of the time."""
    p = torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03])
    n = 20_000
    a, b = words_of([(s, 0) for s in range(n)])
    e = exponentials(a[:, None], b[:, None], torch.arange(5))  # [n, 5]
    counts = torch.bincount((p / e).argmax(dim=1), minlength=5).double()
    expected = p.double() * n
    assert chi2_sf(float(((counts - expected) ** 2 / expected).sum()), 4) > ALPHA
