"""PrefillPace: how many prompt tokens long prefills compute in a step, from this machine's
measured step times (no constants of one CPU). Beside other work such a step costs about SHARE
more than it would without them; alone, a step costs at most about LONE_STEPS plain steps, so
a request arriving meanwhile waits at most that long for its first forward."""

from __future__ import annotations

import itertools
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

SHARE = 0.3
"""Seconds of long prefill a step may carry, as a fraction of the rest of the step: a request
decoding beside a long prompt then runs at about 1 / (1 + SHARE) of its lone speed, which
leaves room below the 2x slowdown we promise for the noise of measured times (a token's cost
is known only after it is spent) and for the wait of a request arriving during a lone step."""
LONE_STEPS = 32
"""A long prefill running alone computes in a step at most what costs about this many plain
steps (a one-token step), so a request arriving meanwhile waits at most about that; where
tokens are cheap (a GPU) it takes its whole cap. Smaller steps cost the prefill more than a
step's fixed cost (the weights read once): each also reads the whole context's keys and
values, and a few tokens attend less efficiently than many (docs/design.md, 5)."""
WINDOW = 9
"""Recent steps whose medians give the costs: a few slow steps (other work on the machine) do
not move them."""
PLAIN_EVERY = 4
"""Beside other work, at least one step in this many computes no long-prefill token (its credit
goes to the next), so the plain steps' cost the others are measured against stays fresh (not
where long prefills take their whole cap: cheap tokens, which that cost no longer bounds); and
at least one in this many computes one, so a token's cost one noisy step overpriced is measured
again."""
GROWTH = 2
"""A grant is at most this many times the most long-prefill tokens a recent step carried (1 at
first): a token's cost is measured from step times, and one lost in their noise can make tokens
look free; the mistake then costs a step twice the size, not one of the whole cap."""


def weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    """The value at which half the weight lies on either side.

    >>> weighted_median([3.0, 1.0, 2.0], [1, 1, 5])
    2.0
    """
    pairs = sorted(zip(values, weights, strict=True))
    total = sum(weights)
    seen = itertools.accumulate(w for _, w in pairs)
    return pairs[next(i for i, s in enumerate(seen) if 2 * s >= total)][0]


@dataclass(slots=True)
class PrefillPace:
    """Token bucket and time cap from measured step times. A plain step's cost (the other
    work's) is the median of recent steps without long-prefill tokens, or `plain_step` (timed
    at start) before any; beside other work at least one step in PLAIN_EVERY is plain, so that
    median stays fresh where every step could afford some tokens. A token's cost is the median
    of recent steps' extra seconds per token, weighted by tokens, so the steps measured best (a
    lone prefill's many tokens) count most and one slow step moves it no more than its share.
    Beside other work each step earns SHARE of a plain step and long prefills spend it at a
    token's cost; alone they take what (LONE_STEPS - 1) plain steps pay for. On a CPU a prompt
    token at a long context costs about a decode step, so a fixed chunk would multiply the
    step; paced, a long prompt advances by a token every step or two there, and by its whole
    cap where tokens are cheap (a GPU).

    >>> pace = PrefillPace(plain_step=0.010)  # a one-token forward timed at start
    >>> pace.grant(32)  # no token measured yet: one measures it (3 ms earned)
    1
    >>> pace.observe(1, 0.011)  # 1 ms a token, spent from the credit
    >>> pace.grant(32), round(pace.credit, 6)  # 2 + 3 ms: 5 tokens, but at most 2 x 1
    (2, 0.005)
    >>> pace.observe(2, 0.012)  # still 1 ms a token: 2 ms spent
    >>> pace.grant(32), round(pace.credit, 6)  # 3 + 3 ms: 6 tokens, at most 2 x 2
    (4, 0.006)
    >>> pace.observe(4, 0.014)
    >>> pace.grant(32), round(pace.credit, 6)  # a plain step after three with tokens
    (0, 0.005)
    >>> pace.observe(0, 0.011)  # the plain steps' cost now: 11 ms
    >>> pace.grant(32), round(pace.credit, 6)  # 5 + 3.3 ms, banked at most 2 x 3.3 + 1
    (7, 0.0076)
    >>> pace.grant(32, alone=True)  # alone: 7 plain steps of 10 ms, 70 tokens, at most 8
    8
    """

    plain_step: float | None = None
    """Seconds of a one-token step (the engine times one at start); None = unknown: until a
    plain step is measured, long prefills then wait beside other work (one step measures it)
    and take their whole cap alone."""
    credit: float = 0.0
    """Seconds long prefills beside other work may still spend."""
    base: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    """Seconds of recent steps without long-prefill tokens."""
    costs: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    """(long-prefill tokens, extra seconds over a plain step) of recent steps that had some."""
    since_plain: int = 0
    """Steps with other work and long-prefill tokens since the last plain one."""
    since_tokens: int = 0
    """Steps with other work since the last that computed long-prefill tokens."""

    def step_cost(self) -> float | None:
        """Seconds of a plain step: the median of the measured ones, else plain_step."""
        return statistics.median(self.base) if self.base else self.plain_step

    def lone_step(self) -> float | None:
        """Seconds of a one-token step, the unit of a lone prefill's time: plain_step, or the
        measured plain steps' median where that is less (the machine is faster than at start;
        where it is more, other requests' work is in it)."""
        known = [c for c in (self.plain_step, self.step_cost()) if c is not None]
        return min(known) if known else None

    def token_cost(self) -> float | None:
        """Extra seconds per long-prefill token of the recent steps that had some, their
        median weighted by tokens; None before any, 0 when they looked free (their extra time
        lost in the noise of the steps).

        >>> pace = PrefillPace(costs=deque([(1, 0.004), (2, 0.002), (1, 5.0), (8, 0.012)]))
        >>> pace.token_cost()  # 1.5 ms a token from the 8-token step; the 5 s step is one token
        0.0015
        """
        if not self.costs:
            return None
        return max(0.0, weighted_median([s / n for n, s in self.costs],
                                        [n for n, _ in self.costs]))  # fmt: skip

    def grant(self, cap: int, alone: bool = False) -> int:
        """Tokens long prefills may compute in this step, at most cap (alone: nothing else
        runs in it). Call it once per step that has a long prefill to advance; beside other
        work it earns the step's credit."""
        plain = self.lone_step() if alone else self.step_cost()
        if plain is None:
            return cap if alone else 0
        most = min(cap, max(1, GROWTH * max((n for n, _ in self.costs), default=0)))
        per_token = self.token_cost()
        if alone:
            # a token costs at least what the last step's did: a prompt's positions only grow,
            # and with them what a token's attention reads
            n, extra = self.costs[-1] if self.costs else (1, 0.0)
            per_token = max(per_token or 0.0, extra / n)
            budget = (LONE_STEPS - 1) * plain
            return most if not per_token else min(most, max(1, int(budget / per_token)))
        earned = SHARE * plain
        # At most two steps' earnings (a plain step's, spent in the next) plus one token
        # banked, so an idle spell is no burst.
        self.credit = min(self.credit + earned, 2 * earned + (per_token or 0.0))
        tokens = most if not per_token else min(most, int(self.credit / per_token))
        if self.since_plain >= PLAIN_EVERY - 1 and tokens < cap:
            return 0  # a plain step keeps the plain cost fresh where it bounds the tokens
        # after steps without any, a token measures its cost again (one step's noise may have
        # priced it beyond what steps earn)
        return max(1, tokens) if self.since_tokens >= PLAIN_EVERY - 1 else tokens

    def observe(self, tokens: int, seconds: float, alone: bool = False) -> None:
        """A step that computed `tokens` long-prefill tokens (alone: nothing else) took
        `seconds`."""
        if tokens == 0:
            self.base.append(seconds)
            self.since_plain = 0
            self.since_tokens += 1
            return
        plain = self.lone_step() if alone else self.step_cost()
        self.costs.append((tokens, seconds - (plain or 0.0)))
        if not alone:
            self.since_plain, self.since_tokens = self.since_plain + 1, 0
            # charged at the recent cost, so one slow step leaves no long debt; a debt beyond
            # the credit (a measuring token's, or one priced above its estimate) is forgiven
            self.credit = max(0.0, self.credit - tokens * (self.token_cost() or 0.0))
