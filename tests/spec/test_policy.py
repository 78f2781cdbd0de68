"""Adaptive speculation (spec/policy.py): the choice maximises expected tokens per second
of a cost model, turns drafting off where it does not pay, and never changes the output."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.checkpoints import SPEC_PAIRS
from verispec import LLM, SamplingParams, SpecConfig
from verispec.spec import policy
from verispec.spec.cost import MeasuredStepCost, expected_accepted
from verispec.spec.policy import AdaptiveSpeculation, choose_num_drafts

pytestmark = pytest.mark.usefixtures("one_thread")


def linear_cost(per_step: float, per_token: float, per_depth: float):
    return lambda tokens, depth: per_step + per_token * tokens + per_depth * depth


def rate(accepted, depths, ks, base, cost) -> float:
    emitted = len(ks) + sum(accepted[i][depths.index(k)] for i, k in enumerate(ks))
    return emitted / cost(base + sum(ks), max(ks, default=0))


@given(
    alphas=st.lists(st.floats(0.0, 0.99), min_size=1, max_size=8),
    per_token=st.floats(0.0, 0.5),
    per_depth=st.floats(0.0, 0.5),
)
def test_the_choice_is_at_least_as_good_as_any_common_depth(alphas, per_token, per_depth) -> None:
    depths = [0, 1, 2, 3, 4]
    accepted = [[expected_accepted(a, d) for d in depths] for a in alphas]
    cost = linear_cost(1.0, per_token, per_depth)
    ks = choose_num_drafts(accepted, depths, len(alphas), cost)
    best = rate(accepted, depths, ks, len(alphas), cost)
    for d in depths:
        assert best >= rate(accepted, depths, [d] * len(alphas), len(alphas), cost) - 1e-12


def test_drafts_pay_for_one_request_and_not_for_a_full_batch() -> None:
    """A bandwidth-bound target (a step costs about the same for 1 or 8 tokens) rewards drafts
    for one request; once the batch makes the forward compute-bound, drafts only add work."""
    cost = MeasuredStepCost(target={1: 0.010, 8: 0.011, 32: 0.040, 64: 0.080, 160: 0.200},
                    draft={4: 0.002})  # fmt: skip
    policy = AdaptiveSpeculation(4, cost=cost)
    for _ in range(20):  # requests whose drafts are mostly accepted
        policy.observe_request("a", 4, 3)
    assert policy.choose(["a"], 1) == [4]
    busy = [f"r{i}" for i in range(32)]
    for r in busy:
        for _ in range(20):
            policy.observe_request(r, 4, 3)
    assert policy.choose(busy, 32) == [0] * 32


def test_a_lone_request_drafts_nothing_where_the_measured_costs_say_drafts_lose() -> None:
    """Drafts accepted 70% of the time still lose for one request when each draft costs 0.6
    of a target step and a verify grows with its tokens (a draft model nearly the target's
    size): the policy drafts nothing, whatever the depth it may take."""
    cost = MeasuredStepCost(target={1: 0.010, 2: 0.014, 3: 0.018, 5: 0.026, 9: 0.042},
                    draft={d: 0.006 * d for d in range(1, 9)})  # fmt: skip
    policy = AdaptiveSpeculation(8, cost=cost)
    for _ in range(20):
        policy.observe_request("a", 8, 5)
    assert policy.choose(["a"], 1) == [0]
    cheap = MeasuredStepCost(target=cost.target, draft={d: 0.0005 * d for d in range(1, 9)})
    policy = AdaptiveSpeculation(8, cost=cheap)  # the same acceptance with a cheap draft pays
    for _ in range(20):
        policy.observe_request("a", 8, 5)
    assert policy.choose(["a"], 1)[0] > 0


def test_requests_that_never_accept_stop_drafting_others_go_on() -> None:
    cost = MeasuredStepCost(target={1: 0.010, 2: 0.011, 4: 0.013, 8: 0.017}, draft={2: 0.001})
    policy = AdaptiveSpeculation(2, cost=cost)
    for _ in range(30):
        policy.observe_request("good", 2, 2)
        policy.observe_request("bad", 2, 0)
    assert policy.choose(["good", "bad"], 2) == [2, 0]


def test_exploration_keeps_estimates_fresh() -> None:
    cost = MeasuredStepCost(target={1: 0.01, 16: 0.011, 300: 0.5}, draft={1: 0.2, 15: 0.2})
    policy = AdaptiveSpeculation(15, cost=cost)
    choices = [policy.choose(["t"], 1) for _ in range(32)]
    assert choices[:15] == [[0]] * 15  # drafting costs 0.2 s for at most 15 tokens: off
    assert choices[15] == [1] and choices[31] == [1]  # ... but every 16th step drafts
    assert choices[16:31] == [[0]] * 15  # to measure again (one request: exploring is cheap)
    busy = [f"r{i}" for i in range(8)]
    assert sum(any(policy.choose(busy, 8)) for _ in range(256)) == 2  # 8 requests: every 128th
    crowd = [f"r{i}" for i in range(64)]
    assert sum(any(policy.choose(crowd, 64)) for _ in range(1024)) == 2  # at most every 512th


def test_drafting_steps_slower_than_predicted_turn_drafts_off() -> None:
    """Drafts that pay on the model's prediction but make steps slower than predicted (here a
    head catching up on one step in three, which the median draft time leaves out) stop once
    the engine has seen it, and the curve never says more tokens cost less."""
    cost = MeasuredStepCost(profile={8: 0.10, 16: 0.11}, draft={1: 0.005})
    policy = AdaptiveSpeculation(1, cost=cost)
    busy = [f"r{i}" for i in range(8)]
    for r in busy:
        for _ in range(10):
            policy.observe_request(r, 1, 0)
            policy.observe_request(r, 1, 1)  # a = 0.5: 12 tokens for 0.115 s against 8 for 0.1
    assert policy.choose(busy, 8) == [1] * 8
    for draft_s in (0.005, 0.005, 0.12) * 2:
        cost.observe(8, 0, 0.10, 0.0)
        cost.observe(16, 1, 0.11, draft_s)  # on average 12 tokens for 0.153 s: no better
    assert cost.drafting_factor() > 1.3
    assert policy.choose(busy, 8) == [0] * 8
    noisy = MeasuredStepCost(profile={8: 0.10, 16: 0.11})
    for _ in range(3):
        noisy.observe(8, 0, 0.2, 0.0)  # a slow patch at 8 tokens
    assert noisy.seconds(16, 0) >= noisy.seconds(8, 0)


def test_a_tree_budget_is_chosen_like_a_chain_depth() -> None:
    """Tree steps accepting m of their nodes (never all: a tree is wider than deep) read as a
    chain accepting m / (m + 1) per token: where verify rows are dear a small budget wins, where
    they are nearly free a large one does."""
    draft = {d: 0.001 for d in range(15)}
    dear = MeasuredStepCost(target={1: 0.010, 3: 0.012, 15: 0.030}, draft=draft)
    cheap = MeasuredStepCost(target={1: 0.010, 15: 0.0105}, draft=draft)
    for cost, want in ((dear, range(1, 8)), (cheap, range(8, 15))):
        policy = AdaptiveSpeculation(14, cost=cost)
        for _ in range(20):
            policy.observe_request("t", 14, 2)
        assert policy.choose(["t"], 1)[0] in want


def test_the_cost_model_takes_the_median_of_recent_steps() -> None:
    """One step slowed by something else on the machine does not move the estimate."""
    cost = MeasuredStepCost(profile={1: 0.01, 16: 0.02})
    for t in (0.010, 0.011, 0.5, 0.012, 0.010):
        cost.observe(1, 0, t, 0.0)
    assert cost.target[1] == pytest.approx(0.011)
    assert cost.curve()[16] == pytest.approx(0.022)  # the profile, scaled to the steps
    cost.observe(16, 0, 0.9, 0.0)  # one slow step at a rare token count: not trusted yet
    assert cost.curve()[16] == pytest.approx(0.022)  # (nor is its range's ratio)
    for t in (0.03, 0.03):
        cost.observe(16, 0, t, 0.0)
    assert cost.curve()[16] == pytest.approx(0.03)  # three steps: their median


def test_busy_steps_scale_the_profile_near_them() -> None:
    """Steps of many sequences cost more per extra token than the one-sequence profile says:
    the ratio measured near 32 tokens scales the profile there, not the one measured at 16."""
    cost = MeasuredStepCost(profile={1: 0.01, 16: 0.02, 32: 0.025, 64: 0.04})
    for _ in range(3):
        cost.observe(16, 0, 0.03, 0.0)  # 1.5x the profile
        cost.observe(40, 0, 0.0575, 0.0)  # 2x the profile at 40 tokens (0.02875)
    curve = cost.curve()
    assert curve[32] == pytest.approx(0.05) and curve[64] == pytest.approx(0.08)
    assert curve[1] == pytest.approx(0.015)  # the nearest range measured: 16's


@pytest.mark.parametrize("spec_pair", [SPEC_PAIRS[0]], indirect=True, ids=["llama"])
def test_adaptive_speculation_keeps_greedy_output(spec_pair) -> None:
    target, draft = spec_pair
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = [[5 + i, 17, 42, 99] for i in range(6)]
    plain = LLM(model=str(target), speculative=None, batch_invariant=True)
    spec = SpecConfig(model=str(draft), num_speculative_tokens=4, adaptive=True)
    adaptive = LLM(model=str(target), speculative=spec, batch_invariant=True)
    assert adaptive.engine.spec_policy is not None
    assert adaptive.engine.spec_policy.cost.profile  # profiled at start-up
    want = [o.token_ids for o in plain.generate(prompts, params)]
    assert [o.token_ids for o in adaptive.generate(prompts, params)] == want
    assert [adaptive.generate(p, params)[0].token_ids for p in prompts] == want
    assert adaptive.engine.spec_policy.cost.draft and adaptive.engine.spec_policy.cost.target


def test_auto_turns_it_on_and_a_fixed_k_stays_fixed() -> None:
    from verispec.spec.resolve import resolve_speculative

    assert resolve_speculative("embedded-code", "auto").adaptive is True  # as the engine does
    explicit = SpecConfig(model="draft/", num_speculative_tokens=3)
    assert explicit.adaptive is False
    with pytest.raises(ValueError, match="adaptive"):
        SpecConfig(model="draft/", adaptive="yes")


def test_the_worked_examples_hold() -> None:
    assert doctest.testmod(policy).failed == 0
