"""PrefillPace: the tokens a long prefill may take beside other work, from step times."""

from __future__ import annotations

import doctest

from verispec.engine import prefill_pace
from verispec.engine.prefill_pace import SHARE, PrefillPace


def test_worked_example() -> None:
    assert doctest.testmod(prefill_pace).failed == 0


def test_steps_beside_a_paced_prefill_cost_about_one_and_a_share() -> None:
    """A simulated machine: a step costs 10 ms plus 4 ms per long-prefill token (a token
    dearer than half a step). Over many steps the prefill takes SHARE of the base time, and
    it never stalls: it advances every few steps."""
    pace, base, per_token = PrefillPace(), 0.010, 0.004
    total, tokens, idle_run, longest_idle = 0.0, 0, 0, 0
    for _ in range(1000):
        granted = pace.grant(256)
        seconds = base + per_token * granted
        pace.observe(granted, seconds)
        total, tokens = total + seconds, tokens + granted
        idle_run = 0 if granted else idle_run + 1
        longest_idle = max(longest_idle, idle_run)
    assert total / (1000 * base) <= 1 + SHARE + 0.01
    assert tokens >= 0.95 * 1000 * SHARE * base / per_token
    assert longest_idle <= 2


def test_cheap_tokens_get_the_whole_cap() -> None:
    """Where a token costs little beside the step (a GPU), the grant reaches the cap."""
    pace = PrefillPace()
    grants = []
    for _ in range(20):
        granted = pace.grant(64)
        pace.observe(granted, 0.010 + 1e-6 * granted)
        grants.append(granted)
    assert grants[-5:] == [64] * 5


def test_a_slow_step_does_not_move_the_costs() -> None:
    pace = PrefillPace()
    for _ in range(10):
        pace.observe(pace.grant(64), 0.010 + 0.001 * 2)
    before = pace.grant(64)
    pace.observe(before, 5.0)  # another process took the machine for one step
    for _ in range(3):
        pace.observe(pace.grant(64), 0.010 + 0.001 * 2)
    assert pace.grant(64) > 0
