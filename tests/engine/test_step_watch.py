"""StepWatch: one step's phases timed into StepTimes by its clock, and the whole step told to
the prefill pace and the adaptive policy."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from verispec.engine.scheduler import Schedule
from verispec.engine.step_drafts import StepDrafts
from verispec.engine.step_watch import StepWatch
from verispec.sample.rejection import Verdict
from verispec.types.stats import PHASES, StepTimes


class Recorder:
    """Stands in for the pace and the policy: keeps what each is told."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.cost = self

    def observe(self, *args: Any) -> None:
        self.calls.append(("observe", *args))

    def observe_request(self, *args: Any) -> None:
        self.calls.append(("request", *args))


def test_a_step_is_timed_by_phase_and_told_to_the_pace_and_the_policy() -> None:
    now = [0.0]
    pace, policy = Recorder(), Recorder()
    watch = StepWatch(StepTimes(), pace, policy, clock=lambda: now[0])  # type: ignore[arg-type]
    request = SimpleNamespace(num_tokens=10, request_id="r")
    chunk = SimpleNamespace(request=request, start=9, token_ids=[1], slots=[], is_decode=True,
                            samples=True, num_draft_slots=2)  # fmt: skip
    plan = Schedule([chunk], [], paced=0)  # type: ignore[list-item]
    drafts = StepDrafts([[4, 5]], [None])
    watch.start()
    for phase, seconds in zip(PHASES, (1.0, 2.0, 3.0, 4.0, 5.0), strict=True):
        now[0] += seconds
        assert watch.timed(phase, lambda x: x * 2, 21) == 42
    watch.end(plan, drafts, Verdict([[4, 6]], [1]))
    assert watch.times.steps == 1
    assert watch.times.kinds["verify"] == [1, 5.0]  # draft + target seconds
    assert pace.calls == [("observe", 0, 15.0, False)]
    assert policy.calls == [("observe", 3, 2, 13.0, 2.0), ("request", "r", 2, 1)]
