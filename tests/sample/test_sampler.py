"""sample: keyed rows reproducible and independent of their batch mates, never a zero-probability
token, noise on the support only, and the right frequencies."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verispec.sample import argmax_rows, sample
from verispec.sample.noise import NoiseKey, exponentials
from verispec.sample.sampler import _exponential_noise


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def keys(seed: int, n: int) -> list[NoiseKey | None]:
    """n rows of one seeded request: output positions 0 .. n - 1."""
    return [NoiseKey(seed, t) for t in range(n)]


def test_same_key_same_tokens_different_key_differs() -> None:
    probs = torch.full((64, 1000), 1e-3)  # flat: 64 draws collide across seeds with tiny chance
    first = sample(probs, keys(7, 64))
    assert torch.equal(first, sample(probs, keys(7, 64)))
    assert not torch.equal(first, sample(probs, keys(8, 64)))
    assert not torch.equal(first[1:], sample(probs[1:], keys(7, 63)))  # positions differ


def test_keyed_rows_ignore_their_batch_mates_and_others_use_the_generator() -> None:
    probs = torch.full((3, 1000), 1e-3)
    batch = sample(probs, [NoiseKey(1, 4), None, NoiseKey(2, 0)], generator=seeded(99))
    assert batch[0] == sample(probs[:1], [NoiseKey(1, 4)])[0]
    assert batch[2] == sample(probs[:1], [NoiseKey(2, 0)], generator=seeded(5))[0]
    assert batch[1] == sample(probs[:1], [None], generator=seeded(99))[0]


def test_greedy_rows_take_argmax() -> None:
    probs = torch.tensor([[0.1, 0.2, 0.7], [0.4, 0.35, 0.25], [0.3, 0.3, 0.4]])
    greedy = torch.tensor([True, True, False])
    for seed in range(20):
        for row_keys in (keys(seed, 3), [None] * 3):
            tokens = sample(probs, row_keys, greedy=greedy, generator=seeded(seed))
            assert tokens[:2].tolist() == [2, 0]


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=40),
    keep=st.lists(st.booleans(), min_size=40, max_size=40),
    seed=st.integers(0, 2**31),
)
def test_never_samples_zero_probability(weights: list[float], keep: list[bool], seed: int) -> None:
    w = torch.tensor(weights) * torch.tensor(keep[: len(weights)])  # [vocab] with masked entries
    w[len(weights) // 2] += 1e-30  # at least one token keeps a (possibly denormal) mass
    probs = (w / w.sum()).expand(8, -1)  # [8, vocab]
    for row_keys in (keys(seed, 8), [None] * 8):
        tokens = sample(probs, row_keys, generator=seeded(seed))
        assert (probs[0, tokens] > 0).all()


def test_cpu_noise_is_drawn_for_the_support_only() -> None:
    """On the CPU a row gets its Exponential(1) noise for the tokens with p > 0 alone, and holds
    1 elsewhere: a generator's row draws them in id order, a keyed row evaluates its counter
    noise there (a token with p = 0 cannot win whatever its noise)."""
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5], [0.25, 0.25, 0.25, 0.25], [0.5, 0.0, 0.5, 0.0]])
    noise = _exponential_noise(probs, [None, None, NoiseKey(3, 8)], seeded(3), support_only=True)
    g = seeded(3)
    support = torch.empty(2).exponential_(generator=g)
    assert torch.equal(noise[0], torch.tensor([1.0, support[0].item(), 1.0, support[1].item()]))
    assert torch.equal(noise[1], torch.empty(4).exponential_(generator=g))
    counter = exponentials(*NoiseKey(3, 8).words(), torch.tensor([0, 2]))
    assert torch.equal(noise[2], torch.tensor([counter[0].item(), 1.0, counter[1].item(), 1.0]))


def test_a_keyed_row_wins_as_its_full_noise_row_would() -> None:
    """Noise on the support only (the CPU's path) or on every id (an accelerator's) elects the
    same token: the noise is a function of the id, so the support's values are the full row's."""
    g = seeded(0)
    for seed in range(50):
        probs = torch.rand(2, 300, generator=g) * (torch.rand(2, 300, generator=g) < 0.1)
        probs[:, 0] += 1e-3
        keys = [NoiseKey(seed, 2), None]
        full = _exponential_noise(probs, keys, seeded(seed), support_only=False)  # [2, 300]
        assert torch.equal(full[0], exponentials(*NoiseKey(seed, 2).words(), torch.arange(300)))
        assert torch.equal(full[1], torch.empty(300).exponential_(generator=seeded(seed)))
        assert int(sample(probs, keys)[0]) == int((probs[0] / full[0]).argmax())


def test_empirical_frequencies_match_distribution() -> None:
    p = torch.tensor([0.4, 0.25, 0.2, 0.1, 0.05])
    n = 20_000
    for row_keys in ([None] * n, [NoiseKey(seed, 0) for seed in range(n)]):
        tokens = sample(p.expand(n, -1), row_keys, generator=seeded(0))
        observed = torch.bincount(tokens, minlength=5).double()
        expected = p.double() * n
        chi2 = ((observed - expected) ** 2 / expected).sum().item()
        assert chi2 < 18.47  # chi-square critical value, 4 degrees of freedom, p = 0.001
        assert (observed / n - p.double()).abs().sum().item() / 2 < 0.02  # total variation


def test_argmax_rows_worked_example() -> None:
    x = torch.tensor([[1.0, 3.0, 3.0], [float("nan"), 9.0, 0.0]])
    assert argmax_rows(x).tolist() == [1, 0] == x.argmax(dim=1).tolist()


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(
        st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.5, float("inf"), -float("inf"), float("nan")]),
        min_size=12, max_size=12,
    ),
    rows=st.integers(1, 4),
)  # fmt: skip
def test_argmax_rows_is_torch_argmax_with_ties_infinities_and_nans(
    values: list[float], rows: int
) -> None:
    x = torch.tensor(values * rows).view(rows, -1)[:, 1:]  # a view that is not contiguous
    got = argmax_rows(x)
    assert got.dtype == torch.int64 and got.tolist() == x.argmax(dim=1).tolist()
    assert argmax_rows(x.double()).tolist() == x.double().argmax(dim=1).tolist()  # torch path
