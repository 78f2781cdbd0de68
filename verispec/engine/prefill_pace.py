"""PrefillPace: how many prompt tokens long prefills may compute in a step that also serves
other requests, from measured step times, so that such a step costs at most about SHARE more
than it would without them."""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

SHARE = 0.5
"""Seconds of long prefill a step may carry, as a fraction of the rest of the step: a request
decoding beside a long prompt then runs at about 1 / (1 + SHARE) of its lone speed, below the
2x slowdown we promise, with room for the noise of measured times."""
WINDOW = 9
"""Recent steps whose median gives each cost: one slow step (other work on the machine) does
not move it."""


@dataclass(slots=True)
class PrefillPace:
    """A token bucket in seconds. Each step that carries other work earns SHARE times the
    median cost of such a step without long prefill (its base); long prefills spend it at the
    median extra seconds per token of the recent steps that carried them. On a
    CPU a prompt token at a long context costs about one decode step, so a fixed chunk would
    multiply the step; paced, a long prompt advances by a token every few steps there, and by
    its whole cap where tokens are cheap (a GPU).

    >>> pace = PrefillPace()
    >>> pace.grant(32)  # no base yet: one step without long prefill measures it
    0
    >>> pace.observe(0, 0.010)
    >>> pace.grant(32)  # no cost per token yet: one token measures it (5 ms earned)
    1
    >>> pace.observe(1, 0.012)  # 2 ms a token, spent from the credit
    >>> pace.grant(32), round(pace.credit, 6)  # 3 ms left + 5 ms earned, banked at most 7
    (3, 0.007)
    >>> pace.observe(3, 0.016)
    >>> pace.grant(32), round(pace.credit, 6)  # 1 ms left + 5 ms earned
    (3, 0.006)
    >>> pace.grant(2)  # never above the cap
    2
    """

    credit: float = 0.0
    """Seconds long prefills may still spend."""
    base: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    """Seconds of recent steps with other work and no long prefill."""
    per_token: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    """Extra seconds per long-prefill token of recent steps that carried some."""

    def grant(self, cap: int) -> int:
        """Tokens long prefills may compute in this step (at most cap), which earns its credit.
        Call it once per step that carries other work and has a long prefill to advance."""
        if not self.base:
            return 0
        earned = SHARE * statistics.median(self.base)
        if not self.per_token:
            self.credit += earned
            return min(cap, 1)
        per_token = statistics.median(self.per_token)
        # At most one step's earnings plus one token banked, so an idle spell is no burst.
        self.credit = min(self.credit + earned, earned + per_token)
        return cap if per_token <= 0 else min(cap, int(self.credit / per_token))

    def observe(self, tokens: int, seconds: float) -> None:
        """A step that carried other work and `tokens` long-prefill tokens took `seconds`."""
        if tokens == 0:
            self.base.append(seconds)
            return
        extra = max(0.0, seconds - statistics.median(self.base)) if self.base else seconds
        self.per_token.append(extra / tokens)
        # Charged at the median cost, so one step slowed by other work leaves no long debt.
        self.credit -= tokens * statistics.median(self.per_token)
