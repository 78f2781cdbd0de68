"""The acceptance and step-cost model (spec/cost.py) that the adaptive policy, self-speculation's
calibration and the benchmarks share: the formulas' worked examples."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verispec.spec import cost
from verispec.spec.cost import (
    RelativeStepCost,
    alpha_from_length,
    expected_accepted,
    predicted_speedup,
    speedup,
    tokens_per_step,
)


def test_the_worked_examples_hold() -> None:
    assert doctest.testmod(cost).failed == 0


def test_formulas_worked_examples() -> None:
    assert tokens_per_step(0.5, 2) == pytest.approx(1.75) and tokens_per_step(1.0, 4) == 5
    assert predicted_speedup(0.5, 2, 0.25) == pytest.approx(1.75 / 1.5)
    assert predicted_speedup(None, 2, 0.1) is None
    assert alpha_from_length(tokens_per_step(0.7, 4), 4) == pytest.approx(0.7, abs=1e-9)


@given(a=st.floats(0.0, 0.999), k=st.integers(0, 8))
def test_one_geometric_model(a: float, k: int) -> None:
    """Tokens per step are the accepted drafts and the target's own token, and the closed form
    is the sum of the acceptance chances of each position."""
    assert tokens_per_step(a, k) == pytest.approx(1 + expected_accepted(a, k))
    assert expected_accepted(a, k) == pytest.approx(sum(a**i for i in range(1, k + 1)))


def test_step_cost_model() -> None:
    model = RelativeStepCost(fixed=0.2, num_layers=10, verify_per_token=0.1)
    # all layers kept, every draft accepted at k = 1: 2 tokens for 1 + 1.1 steps
    assert model.speedup(1.0, 1, 10) == pytest.approx(2 / 2.1)
    # half the layers: a draft step costs 0.6; k = 2 with 1.5 accepted: 2.5 / (1.2 + 1.2)
    assert model.speedup(1.5, 2, 5) == pytest.approx(2.5 / 2.4)
    # Leviathan et al.'s prediction is the same model with verification at no extra cost
    assert predicted_speedup(0.5, 2, 0.25) == speedup(expected_accepted(0.5, 2), 2, 0.25, 0.0)
