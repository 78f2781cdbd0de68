"""SpecStats: acceptance statistics of speculative decoding, with vLLM's definitions.

- draft tokens: tokens proposed (k per verify step, fewer when a drafter has less to say).
- acceptance rate = accepted / draft tokens.
- mean acceptance length = 1 + accepted / verify steps (counts the recovered/bonus token).
- per-position acceptance rate[i] = verify steps where draft position i was accepted / steps.
Only steps that verified at least one draft token count as verify steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class SpecStats:
    """Counters for one request, or summed over many."""

    num_verify_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    """accepted_per_position[i]: verify steps where draft position i was accepted."""
    num_forced_tokens: int = 0
    """Of num_draft_tokens, those a grammar forced (free to draft, verified like the rest)."""
    num_accepted_forced_tokens: int = 0
    """Of num_accepted_tokens, the forced ones."""

    def record(self, num_drafts: int, num_accepted: int, num_forced: int = 0) -> None:
        """Count one verify step that proposed num_drafts tokens (the first num_forced of them
        forced by a grammar) and kept num_accepted."""
        if num_drafts == 0:
            return
        self.num_verify_steps += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        self.num_forced_tokens += num_forced
        self.num_accepted_forced_tokens += min(num_accepted, num_forced)
        if len(self.accepted_per_position) < num_drafts:
            self.accepted_per_position += [0] * (num_drafts - len(self.accepted_per_position))
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1

    def merge(self, other: SpecStats) -> None:
        """Add another request's counters to these."""
        self.num_verify_steps += other.num_verify_steps
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        self.num_forced_tokens += other.num_forced_tokens
        self.num_accepted_forced_tokens += other.num_accepted_forced_tokens
        for i, n in enumerate(other.accepted_per_position):
            if i < len(self.accepted_per_position):
                self.accepted_per_position[i] += n
            else:
                self.accepted_per_position.append(n)

    @property
    def acceptance_rate(self) -> float | None:
        if not self.num_draft_tokens:
            return None
        return self.num_accepted_tokens / self.num_draft_tokens

    @property
    def mean_acceptance_length(self) -> float | None:
        if not self.num_verify_steps:
            return None
        return 1 + self.num_accepted_tokens / self.num_verify_steps

    @property
    def per_position_acceptance_rate(self) -> list[float]:
        steps = self.num_verify_steps
        return [n / steps for n in self.accepted_per_position] if steps else []

    def to_dict(self) -> dict[str, Any]:
        """Counters and derived rates, for JSON output."""
        return {
            "num_verify_steps": self.num_verify_steps,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "per_position_acceptance_rate": self.per_position_acceptance_rate,
            "num_forced_tokens": self.num_forced_tokens,
            "num_accepted_forced_tokens": self.num_accepted_forced_tokens,
        }


PHASES = ("schedule", "draft", "target", "verify", "update")
STEP_KINDS = ("decode", "verify")


@dataclass(slots=True)
class StepTimes:
    """Wall seconds an engine spent in each phase of its steps, summed (where the time goes).

    draft = the proposer, target = the target forward, verify = rejection sampling, update =
    bookkeeping after it. On an accelerator, work queued by one phase may be waited for in a
    later one; on CPU each phase's time is its own.
    """

    steps: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    kinds: dict[str, list[float]] = field(
        default_factory=lambda: {kind: [0, 0.0] for kind in STEP_KINDS}
    )
    """kind -> [steps, seconds of their draft and target phases]: "decode", steps in which every
    request decodes one token without drafts (a plain decode step); "verify", steps in which
    every request decodes one token and verifies drafts. Steps with a prompt chunk are neither.
    A pass's own steps of both kinds give a step's cost without drift between passes."""
    _mark: float = field(default=0.0, repr=False)  # perf_counter() at the last start or lap

    def start(self) -> None:
        """Begin timing a step."""
        self._mark = time.perf_counter()

    def lap(self, phase: str) -> None:
        """Add the time since the last start or lap to `phase`."""
        now = time.perf_counter()
        self.seconds[phase] += now - self._mark
        self._mark = now

    def record(self, kind: str | None, seconds: float) -> None:
        """Count one step of `kind` (STEP_KINDS, or None: neither) and its forward seconds."""
        if kind is not None:
            self.kinds[kind][0] += 1
            self.kinds[kind][1] += seconds

    def fractions(self) -> dict[str, float]:
        """Each phase's share of the total: e.g. {"draft": 0.2, "target": 0.6, ...}."""
        total = sum(self.seconds.values())
        return {p: (s / total if total else 0.0) for p, s in self.seconds.items()}

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "seconds": dict(self.seconds), "fractions": self.fractions(),
                "kinds": {kind: list(v) for kind, v in self.kinds.items()}}
