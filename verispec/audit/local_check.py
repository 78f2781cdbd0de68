"""`verispec verify` on a local engine: speculative requests against plain requests of the same
engine (SamplingParams.speculative=False: 0 drafts, plain decoding) for greedy output, and
against the target's exact distribution (audit/distribution.py) for sampling."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from verispec.api.llm import LLM
from verispec.audit.distribution import TargetProbe, WarpedRow
from verispec.audit.fit import MIN_EXPECTED, Block, Fit, fit_blocks
from verispec.audit.report import (
    TOP_LOGPROBS,
    Check,
    DraftCounts,
    GreedyPrompt,
    SamplingPrompt,
    exact_prompt,
    greedy_prompt,
)
from verispec.types.sampling_params import SamplingParams

TokenPrompt = tuple[str, list[int]]  # (id, token ids)


def run(
    llm: LLM, prompts: Sequence[TokenPrompt], check: Check
) -> tuple[list[GreedyPrompt], list[SamplingPrompt], DraftCounts]:
    """The greedy or the sampling check (as check.params asks) of every prompt."""
    if check.params.greedy:
        greedy, drafts = greedy_check(llm, prompts, check.params.max_tokens, check.tolerance,
                                      check.strict)  # fmt: skip
        return greedy, [], drafts
    sampling, drafts = sampling_check(llm, prompts, check.params, check.samples, check.seed,
                                      check.alpha, check.tolerance, check.strict)  # fmt: skip
    return [], sampling, drafts


def greedy_check(
    llm: LLM, prompts: Sequence[TokenPrompt], max_tokens: int, tolerance: float, strict: bool
) -> tuple[list[GreedyPrompt], DraftCounts]:
    """Every prompt decoded greedily with speculation and plainly (with the top logprobs that
    weigh a difference), all in one batch: a plain request gets 0 drafts whatever its batch
    mates, and in the default mode batch mates change rounding either way (the near-tie rule
    covers it); EOS ignored, so all run max_tokens."""
    base = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    ids = [p for _, p in prompts]
    plain_params = replace(base, speculative=False, logprobs=TOP_LOGPROBS)
    outs = llm.generate(ids * 2, [base] * len(ids) + [plain_params] * len(ids))
    spec, plain = outs[: len(ids)], outs[len(ids) :]
    if any(o.metrics.spec.num_draft_tokens for o in plain):
        raise RuntimeError("a request with speculative=False verified drafts")
    drafts = DraftCounts()
    for o in spec:
        drafts.add(o.metrics.spec.num_draft_tokens, o.metrics.spec.num_accepted_tokens)
    results = []
    for (pid, _), s, p in zip(prompts, spec, plain, strict=True):
        top = [t.top for t in p.logprobs or []]
        results.append(greedy_prompt(pid, s.token_ids, p.token_ids, top, tolerance, strict))
    return results, drafts


def draw_first_two(
    llm: LLM, prompt: list[int], params: SamplingParams, n: int, seed: int
) -> tuple[Counter[tuple[int, int]], int, DraftCounts]:
    """n speculative requests, each stopped once it has its first two tokens: their counts,
    how many second tokens were verified against drafts, and the drafts. Every other request
    is seeded (seed + i: verified by coupling) and the rest draw from the engine's generator
    (rejection sampling), so both verifiers are checked (docs/design.md, 3). max_tokens leaves
    room for the full k at the second step (the scheduler drafts at most max_tokens - 2 there;
    max_tokens=2 would draft nothing)."""
    engine = llm.engine
    spec = engine.config.speculative
    k = spec.num_speculative_tokens if spec is not None else 0
    params = replace(params, max_tokens=2 + k, ignore_eos=True)
    requests = [engine.add_request(prompt, replace(params, seed=seed + i if i % 2 == 0 else None))
                for i in range(n)]  # fmt: skip
    while engine.has_unfinished():
        for r in engine.step():
            if len(r.output_token_ids) >= 2 and not r.finished:
                engine.abort_request(r)
    counts: Counter[tuple[int, int]] = Counter()
    drafts = DraftCounts()
    verified = 0
    for r in requests:
        if len(r.output_token_ids) < 2:
            raise ValueError(f"a prompt of {len(prompt)} tokens leaves no room for two output "
                             f"tokens in max_model_len {engine.max_model_len}")  # fmt: skip
        counts[(r.output_token_ids[0], r.output_token_ids[1])] += 1
        verified += r.spec_stats.num_draft_tokens > 0
        drafts.add(r.spec_stats.num_draft_tokens, r.spec_stats.num_accepted_tokens)
    return counts, verified, drafts


def sampling_check(
    llm: LLM,
    prompts: Sequence[TokenPrompt],
    params: SamplingParams,
    samples: int,
    seed: int,
    alpha: float,
    tolerance: float,
    strict: bool,
) -> tuple[list[SamplingPrompt], DraftCounts]:
    """Per prompt, the joint of the first two tokens of `samples` speculative requests against
    the target's exact joint p(t1) p(t2 | t1), at alpha / (2 prompts) for each of the
    chi-square and the TV bound (Bonferroni)."""
    threshold = alpha / (2 * len(prompts))
    results, total = [], DraftCounts()
    for i, (pid, ids) in enumerate(prompts):
        counts, verified, drafts = draw_first_two(llm, ids, params, samples, seed + i * samples)
        total.add(drafts.drafted, drafts.accepted)
        with TargetProbe(llm.engine.runner.target, ids, params) as probe:
            fit, near = exact_fit(probe, counts, samples, tolerance, strict, threshold)
        results.append(exact_prompt(pid, fit, verified, near, threshold))
    return results, total


def exact_fit(
    probe: TargetProbe,
    counts: Counter[tuple[int, int]],
    n: int,
    tolerance: float,
    strict: bool,
    delta: float,
) -> tuple[Fit, int]:
    """The Fit of counts against the exact joint, and the samples near a top-k/top-p boundary.

    Rows p(t2 | t1) are computed for every observed t1 and every t1 with n p(t1) >=
    MIN_EXPECTED (any cell that can be kept whole by the pooling rule), so the chi-square is
    the one over all vocab^2 cells; other t1 form the unresolved mass (fit.fit_blocks)."""
    first = probe.first
    likely = np.flatnonzero(first.probs * n >= MIN_EXPECTED).tolist()
    rows = probe.second({t1 for t1, _ in counts} | set(likely))
    observed = {t1: np.zeros(len(row.probs), dtype=np.int64) for t1, row in rows.items()}
    for (t1, t2), c in counts.items():
        observed[t1][t2] = c
    blocks = [Block(first.probs[t1] * row.probs, observed[t1]) for t1, row in rows.items()]
    unresolved = float(first.probs.sum() - sum(first.probs[t] for t in rows))
    near = 0 if strict else sum(
        c for (t1, t2), c in counts.items() if _near_boundary(first, rows[t1], t1, t2, tolerance)
    )  # fmt: skip
    return fit_blocks(blocks, max(unresolved, 0.0), delta), near


def _near_boundary(first: WarpedRow, second: WarpedRow, t1: int, t2: int, tolerance: float) -> bool:
    """A sample in a removed token whose logit is within tolerance of the kept boundary."""
    if first.probs[t1] == 0:
        return bool(first.gap[t1] <= tolerance)
    return second.probs[t2] == 0 and bool(second.gap[t2] <= tolerance)
