"""StepWatch: the one observer of an engine step's times. Each phase goes to StepTimes; the
whole step goes to those that learn from it: the prefill pace and the adaptive policy."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from verispec.engine.prefill_pace import PrefillPace
from verispec.engine.scheduler import Schedule, step_kind
from verispec.engine.step_drafts import StepDrafts
from verispec.sample.rejection import Verdict
from verispec.spec.policy import AdaptiveSpeculation
from verispec.types.stats import StepTimes

P = ParamSpec("P")
R = TypeVar("R")


class StepWatch:
    """Times the phases of one step at a time (start, timed per phase, end)."""

    def __init__(
        self, times: StepTimes, pace: PrefillPace | None, policy: AdaptiveSpeculation | None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:  # fmt: skip
        self.times = times
        """Seconds per phase, summed over steps (a caller may swap in a fresh one)."""
        self.pace = pace
        self.policy = policy
        self.clock = clock
        """Seconds, read around each phase for the pace and the policy (a test gives its own to
        simulate a slower machine)."""
        self._marks: dict[str, float] = {}  # phase -> clock() when it ended; "" = the start

    def start(self) -> StepWatch:
        """Begin a step."""
        self.times.start()
        self._marks = {"": self.clock()}
        return self

    def timed(self, phase: str, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run one phase of the step (a name of types.stats.PHASES) and time it."""
        result = fn(*args, **kwargs)
        self.times.lap(phase)
        self._marks[phase] = self.clock()
        return result

    def end(self, plan: Schedule, drafts: StepDrafts, verdict: Verdict) -> None:
        """Close the step: count it (and its kind's drafting and forward seconds), and tell the
        pace and the policy how long it took."""
        marks, step_s = self._marks, self.clock() - self._marks[""]
        self.times.steps += 1
        self.times.record(step_kind(plan.scheduled, drafts), marks["target"] - marks["schedule"])
        if self.pace is not None:
            self.pace.observe(plan.paced, step_s, plan.alone)
        if self.policy is not None:
            draft_s = marks["draft"] - marks["schedule"]
            observe_step(self.policy, plan, drafts, verdict, step_s, draft_s)


def observe_step(
    policy: AdaptiveSpeculation, plan: Schedule, drafts: StepDrafts, verdict: Verdict,
    step_s: float, draft_s: float,
) -> None:  # fmt: skip
    """Feed the adaptive policy one step's times and each request's acceptance."""
    tokens = sum(len(s.token_ids) + len(ids)
                 for s, ids in zip(plan.scheduled, drafts.token_ids, strict=True))  # fmt: skip
    # Forced drafts cost nothing to draft: the drafter's depth leaves them out, the target's
    # tokens count them (they are verify rows like any draft).
    forced = drafts.forced(range(len(plan.scheduled)))
    depth = max((len(ids) - f for ids, f in zip(drafts.token_ids, forced, strict=True)),
                default=0)  # fmt: skip
    # Prefill tokens cost less than verify rows (shorter attention): only steps of decode
    # rows and their drafts teach the target curve, which the policy asks about them.
    decode_only = all(s.is_decode for s in plan.scheduled)
    policy.cost.observe(tokens if decode_only else None, depth, step_s - draft_s, draft_s)
    for s, ids, f, accepted in zip(plan.sampling, drafts.rows(plan.sampled),
                                   drafts.forced(plan.sampled), verdict.num_accepted,
                                   strict=True):  # fmt: skip
        # The drafter's acceptance: its drafts were judged only if every forced one passed.
        if accepted >= f:
            policy.observe_request(s.request.request_id, len(ids) - f, accepted - f)
