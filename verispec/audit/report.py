"""What `verispec verify` found: per-prompt evidence, the verdict by its rule, as text and JSON.

The rules (docs/verify.md states them for users):

- Greedy: speculative and plain output ids are compared per prompt. In batch-invariant mode
  any difference fails. Otherwise a prompt may differ only at a near tie: at the first
  differing position the speculative token's logit under the plain target is within the tie
  tolerance of the plain target's top logit, a gap float rounding of a multi-row verify
  forward can flip (docs/design.md, 3); later tokens of that prompt are not compared.
- Sampling: each prompt's test runs at alpha / prompts (Bonferroni), so an exact
  configuration fails with probability at most alpha. Against the target's exact distribution
  (a local engine) the chi-square and the TV bound each take half of that, and a sample in a
  token top-k/top-p removes (beyond float rounding of the boundary) fails; against samples
  with speculation off (a server) the two-sample chi-square takes all of it.
- Either way, no draft verified at all is inconclusive: nothing speculative was checked.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from verispec.audit.fit import Comparison, Fit
from verispec.types.sampling_params import SamplingParams

EXACT, NOT_EXACT, INCONCLUSIVE = "exact", "not exact", "inconclusive"
EXIT_CODES = {EXACT: 0, NOT_EXACT: 1, INCONCLUSIVE: 1}

TIE_TOLERANCE = {"float32": 1e-3, "float16": 0.03, "bfloat16": 0.25}
"""Default greedy tie tolerance (nats of logit margin) per dtype: several times the rounding
difference one multi-row product makes in a logit of typical size (float32 ~1e-4; float16 and
bfloat16 logits are themselves rounded to ~0.016 and ~0.125 near 16)."""
DEFAULT_ALPHA = 0.01
"""Significance level of the sampling verdict: an exact configuration fails with at most this
probability (split over prompts and tests by Bonferroni)."""


@dataclass(frozen=True)
class Check:
    """What a run checks, and how: greedy when params is greedy, else sampling."""

    params: SamplingParams
    """The user's sampling settings (greedy: max_tokens is the output compared per prompt)."""
    samples: int
    """Sampling: speculative samples per prompt."""
    alpha: float
    tolerance: float
    """Greedy: the tie tolerance (nats); sampling: how close to a top-k/top-p boundary a
    removed token may be to count as float rounding."""
    strict: bool
    """Batch-invariant: no rounding excuse, any difference fails."""

    @property
    def seed(self) -> int:
        return self.params.seed or 0

    def settings(self) -> dict[str, Any]:
        p = self.params
        if p.greedy:
            return {"tokens per prompt": p.max_tokens, "tie tolerance": self.tolerance}
        return {"temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k,
                "samples per prompt": self.samples, "alpha": self.alpha,
                "seeds from": self.seed}  # fmt: skip


@dataclass
class DraftCounts:
    """Draft tokens the speculative requests verified, and how many were accepted."""

    drafted: int = 0
    accepted: int = 0

    def add(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted


# a position's likeliest (token key, logprob) pairs, likeliest first: a key is a token id
# locally, the token's text through a server
TopLogprobs = Sequence[tuple[Hashable, float]]
TOP_LOGPROBS = 5
"""Alternatives asked of the plain run per position: a speculative token outside them is
further than top-1 minus top-5 from the top."""

IDENTICAL, NEAR_TIE, DIFFERS = "identical", "near tie", "differs"


@dataclass(frozen=True)
class GreedyPrompt:
    """One prompt's greedy comparison."""

    id: str
    tokens: int
    """Output tokens compared: all of plain's when identical, else those before the difference."""
    first_difference: int | None
    """Output position of the first differing token (None: identical)."""
    plain_token: Hashable | None
    speculative_token: Hashable | None
    margin: float | None
    """The plain target's top-1 minus top-2 logprob (= logit) there; None when unknown."""
    gap: float | None
    """The plain target's top-1 minus the speculative token's logprob there (>= margin); None
    when the token is not among the plain run's TOP_LOGPROBS likeliest."""
    result: str
    """identical, near tie, or differs."""


def greedy_prompt(
    prompt_id: str,
    speculative: Sequence[Hashable],
    plain: Sequence[Hashable],
    plain_top: Sequence[TopLogprobs],
    tolerance: float,
    strict: bool,
    speculative_keys: Sequence[Hashable] | None = None,
) -> GreedyPrompt:
    """Compare output token ids and classify the first difference by the plain target's
    likeliest (key, logprob) at each of its positions (plain_top): a near tie when the
    speculative token (its key: speculative_keys, else its id) is among them with a logprob
    within tolerance of the top one (exact ties included, in any order).

    >>> top = [[(5, -0.1), (6, -2.0)], [(7, -0.6931), (8, -0.6932), (9, -0.6932)]]
    >>> greedy_prompt("p", [5, 9], [5, 7], top, 1e-3, strict=False).result
    'near tie'
    >>> greedy_prompt("p", [5, 8], [5, 7], top, 1e-3, strict=True).result
    'differs'
    >>> g = greedy_prompt("p", [6, 7], [5, 7], top, 1e-3, strict=False)
    >>> (g.result, g.margin, g.gap)
    ('differs', 1.9, 1.9)
    """
    common = zip(speculative, plain, strict=False)  # a shorter one is handled below
    pos = next((i for i, (a, b) in enumerate(common) if a != b), None)
    if pos is None and len(speculative) == len(plain):
        return GreedyPrompt(prompt_id, len(plain), None, None, None, None, None, IDENTICAL)
    if pos is None:  # one output is a prefix of the other: no token to weigh
        pos = min(len(speculative), len(plain))
        return GreedyPrompt(prompt_id, pos, pos, _at(plain, pos), _at(speculative, pos), None,
                            None, DIFFERS)  # fmt: skip
    top = list(plain_top[pos]) if pos < len(plain_top) else []
    margin = round(top[0][1] - top[1][1], 6) if len(top) >= 2 else None
    key = (speculative if speculative_keys is None else speculative_keys)[pos]
    found = next((lp for k, lp in top[1:] if k == key), None)
    gap = None if found is None else round(top[0][1] - found, 6)
    tie = not strict and gap is not None and gap <= tolerance
    return GreedyPrompt(prompt_id, pos, pos, plain[pos], speculative[pos], margin, gap,
                        NEAR_TIE if tie else DIFFERS)  # fmt: skip


def _at(tokens: Sequence[Hashable], pos: int) -> Hashable | None:
    return tokens[pos] if pos < len(tokens) else None


@dataclass(frozen=True)
class SamplingPrompt:
    """One prompt's test of the joint distribution of the first two generated tokens."""

    id: str
    samples: int
    """Speculative samples (and as many with speculation off, against a server)."""
    verified: int
    """Speculative samples whose second token was verified against drafts."""
    chi2: float
    dof: int
    p_value: float
    tv: float
    tv_limit: float
    """Exact reference: TV's rigorous bound at the prompt's share of alpha (a test). Two
    samples: an estimate of TV's sampling noise, shown, not tested."""
    impossible: int
    """Samples in tokens that top-k/top-p remove (exact reference only; near boundary ones
    not counted)."""
    near_boundary: int
    """Samples in removed tokens within the tie tolerance of the boundary (float rounding)."""
    threshold: float
    """The prompt's significance level: alpha / prompts, halved for the exact reference."""
    passed: bool
    tv_tested: bool = True
    """Whether tv_limit is a bound the verdict tests (exact reference) or shown only."""


def exact_prompt(
    prompt_id: str, fit: Fit, verified: int, near_boundary: int, threshold: float
) -> SamplingPrompt:
    """Against the exact distribution: p-value above threshold, TV within its bound (computed
    at delta = threshold), no impossible sample beyond those near a boundary."""
    impossible = fit.impossible - near_boundary
    passed = fit.p_value > threshold and fit.tv <= fit.tv_bound and impossible == 0
    return SamplingPrompt(prompt_id, fit.n, verified, fit.chi2, fit.dof, fit.p_value, fit.tv,
                          fit.tv_bound, impossible, near_boundary, threshold, passed)  # fmt: skip


def two_sample_prompt(
    prompt_id: str, comparison: Comparison, verified: int, threshold: float
) -> SamplingPrompt:
    """Speculative against plain samples: the two-sample chi-square's p-value above threshold."""
    c = comparison
    return SamplingPrompt(prompt_id, c.n_a, verified, c.chi2, c.dof, c.p_value, c.tv,
                          c.tv_noise, 0, 0, threshold, c.p_value > threshold,
                          tv_tested=False)  # fmt: skip


@dataclass
class Report:
    """Everything `verispec verify` prints and writes."""

    mode: str
    """greedy or sampling."""
    reference: str
    """What speculative output was compared with."""
    settings: dict[str, Any]
    greedy: list[GreedyPrompt] = field(default_factory=list)
    sampling: list[SamplingPrompt] = field(default_factory=list)
    draft_tokens: int = 0
    accepted_tokens: int = 0
    seconds: float = 0.0
    verdict: str = INCONCLUSIVE
    reason: str = ""

    def add(
        self, greedy: list[GreedyPrompt], sampling: list[SamplingPrompt], drafts: DraftCounts
    ) -> None:
        """Take a check's evidence (audit/local_check.py or server_check.py: run)."""
        self.greedy, self.sampling = greedy, sampling
        self.draft_tokens, self.accepted_tokens = drafts.drafted, drafts.accepted

    def decide(self) -> None:
        """Set verdict and reason from the evidence (the module docstring's rules)."""
        rows: Sequence[GreedyPrompt | SamplingPrompt] = self.greedy or self.sampling
        if self.greedy:
            bad = [p.id for p in self.greedy if p.result == DIFFERS]
            ties = sum(p.result == NEAR_TIE for p in self.greedy)
            summary = f"{len(self.greedy) - len(bad) - ties} identical, {ties} near ties"
        else:
            bad = [p.id for p in self.sampling if not p.passed]
            summary = f"{len(self.sampling) - len(bad)} of {len(rows)} prompts pass"
        if bad:
            self.verdict = NOT_EXACT
            self.reason = f"{len(bad)} of {len(rows)} prompts fail: {', '.join(bad)}"
        elif self.draft_tokens == 0:
            self.verdict = INCONCLUSIVE
            self.reason = "no draft was verified, so nothing speculative was checked"
        else:
            self.verdict = EXACT
            self.reason = f"{summary}, {self.draft_tokens} draft tokens verified"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["exit_code"] = self.exit_code
        return out

    def write_json(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n")

    def text(self) -> str:
        """The report as printed: settings, one line per prompt, drafts, verdict."""
        lines = [f"verispec verify: {self.mode}, speculative decoding vs {self.reference}"]
        lines += [f"  {k}: {v}" for k, v in self.settings.items()]
        lines += [_greedy_line(p) for p in self.greedy]
        lines += [_sampling_line(p) for p in self.sampling]
        rate = f" ({self.accepted_tokens / self.draft_tokens:.0%})" if self.draft_tokens else ""
        lines.append(f"drafts verified: {self.draft_tokens}, accepted {self.accepted_tokens}"
                     f"{rate}")  # fmt: skip
        lines.append(f"verdict: {self.verdict.upper()}: {self.reason} ({self.seconds:.0f} s)")
        return "\n".join(lines)


def _greedy_line(p: GreedyPrompt) -> str:
    if p.result == IDENTICAL:
        return f"  {p.id}: identical ({p.tokens} tokens)"
    margin = "unknown" if p.margin is None else f"{p.margin:.3g}"
    gap = f"beyond the plain top {TOP_LOGPROBS}" if p.gap is None else f"{p.gap:.3g}"
    what = ("near tie (float rounding)" if p.result == NEAR_TIE
            else "DIFFERS (a real divergence)")  # fmt: skip
    return (f"  {p.id}: {what} at output token {p.first_difference}: plain "
            f"{p.plain_token!r}, speculative {p.speculative_token!r}; plain top-2 margin "
            f"{margin}, speculative token below the top by {gap}")  # fmt: skip


def _sampling_line(p: SamplingPrompt) -> str:
    status = "pass" if p.passed else "FAIL"
    extra = f", impossible {p.impossible}" if p.impossible else ""
    extra += f", near a top-k/top-p boundary {p.near_boundary}" if p.near_boundary else ""
    limit = (f"bound {p.tv_limit:.4f}" if p.tv_tested
             else f"noise ~{p.tv_limit:.4f}, not tested")  # fmt: skip
    return (f"  {p.id}: {status}: chi2 {p.chi2:.1f} (dof {p.dof}), p = {p.p_value:.3g} "
            f"(needs > {p.threshold:.2g}), TV {p.tv:.4f} ({limit}), "
            f"{p.verified} of {p.samples} second tokens verified against drafts"
            f"{extra}")  # fmt: skip
