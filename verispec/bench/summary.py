"""A configuration's measurements and the report row made of them: medians over repeats,
speedups against the same engine's plain runs, the predicted speedup, and the greedy check."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from verispec.bench.engines import BatchRun, MethodSpec, Sampling
from verispec.bench.plan import ENGINES, BenchConfig, Group, own_layers, own_tree
from verispec.bench.verify_cost import (
    PassTimes,
    step_cost_ratio,
    step_predicted_speedup,
)
from verispec.drafters.registry import PLAIN, takes_draft_model, takes_head
from verispec.spec.cost import alpha_from_length, predicted_speedup
from verispec.types.stats import SpecStats


@dataclass
class Measured:
    """All repeats of one configuration in one group; ran: the shape the engine ran."""

    engine: str
    spec: MethodSpec
    ran: MethodSpec
    runs: list[BatchRun] = field(default_factory=list)
    plain_runs: list[BatchRun] = field(default_factory=list)  # same engine, same repeats


def summarise(
    m: Measured, group: Group, sampling: Sampling, config: BenchConfig, draft_cost: float | None
) -> dict[str, Any]:
    """One row of the report (field names as documented in benchmarks/README.md)."""
    med = statistics.median
    ttfts = [r.ttft_s for run in m.runs for r in run.requests]
    itls = [g for run in m.runs for r in run.requests for g in r.itl_s]
    stats = SpecStats()
    for run in m.runs:
        stats.merge(run.spec_stats())
    speedup = med(
        a.tokens_per_s / b.tokens_per_s for a, b in zip(m.runs, m.plain_runs, strict=True)
    )
    tpots = [t for run in m.runs for t in (r.tpot_s for r in run.requests) if t is not None]
    decode = [b.tpot_s / a.tpot_s for a, b in zip(m.runs, m.plain_runs, strict=True)
              if a.tpot_s and b.tpot_s]  # fmt: skip
    spec, plain = m.ran, m.ran.method == PLAIN
    tree = spec.tree
    per_position = stats.per_position_acceptance_rate[: tree.depth if tree else None]
    return {
        "engine": m.engine,
        "method": spec.method,
        "k": spec.k,
        "tree_topk": tree.topk if tree else None,
        "tree_depth": tree.depth if tree else None,
        "budget": tree.budget if tree else None,
        "tree_lookup": tree.lookup if tree else None,
        "temperature": group.temperature,
        "top_p": sampling.top_p,
        "workload": group.workload,
        "concurrency": group.concurrency,
        "dtype": config.dtype,
        "threads": config.threads,
        "prompts": len(m.runs[0].requests),
        "max_tokens": sampling.max_tokens,
        "repeats": len(m.runs),
        "tokens_per_s": med(run.tokens_per_s for run in m.runs),
        "tokens_per_s_runs": [run.tokens_per_s for run in m.runs],
        "ttft_s_median": med(ttfts),
        "ttft_s_p90": float(np.percentile(ttfts, 90)),
        "itl_s_median": med(itls) if itls else None,
        "itl_s_p90": float(np.percentile(itls, 90)) if itls else None,
        "tpot_s_mean": sum(tpots) / len(tpots) if tpots else None,
        "acceptance_rate": stats.acceptance_rate,
        "mean_acceptance_length": stats.mean_acceptance_length,
        "per_position_acceptance_rate": per_position,
        "speedup": 1.0 if plain else speedup,
        "decode_speedup": 1.0 if plain else (med(decode) if decode else None),
        **_predicted(m, group, stats.mean_acceptance_length, draft_cost),
        "time_fractions": _time_fractions(m),
    }


def _predicted(
    m: Measured, group: Group, length: float | None, draft_cost: float | None
) -> dict[str, float | None]:
    """draft_cost_ratio, step_cost_ratio and predicted_speedup of a row: Leviathan's formula
    for draft models and prompt lookup; a head's chain or tree, whose draft runs no model
    alone, from this run's phase times (tokens per step / step cost; concurrency 1 only)."""
    spec = m.ran
    if spec.method == PLAIN:
        return {"draft_cost_ratio": None, "step_cost_ratio": None, "predicted_speedup": None}
    step = None
    timed = PassTimes.of(m.runs), PassTimes.of(m.plain_runs)
    if group.concurrency == 1 and timed[0] is not None and timed[1] is not None:
        step = step_cost_ratio(*timed)
    if takes_head(spec.method) or own_tree(spec) or own_layers(spec):  # from the step times
        predicted = step_predicted_speedup(length, step)
        return {"draft_cost_ratio": None, "step_cost_ratio": step, "predicted_speedup": predicted}
    cost = draft_cost if takes_draft_model(spec.method) else 0.0
    predicted = None
    if cost is not None:
        predicted = predicted_speedup(alpha_from_length(length, spec.k), spec.k, cost)
    return {"draft_cost_ratio": cost, "step_cost_ratio": step, "predicted_speedup": predicted}


def _time_fractions(m: Measured) -> dict[str, float] | None:
    """Share of wall time in the draft, the target forward and verification, and `other`
    (scheduling, bookkeeping, and the Python around the steps); None for transformers."""
    if any(run.phases is None for run in m.runs):
        return None
    wall = sum(run.wall_s for run in m.runs)
    shares = {p: sum(run.phases[p] for run in m.runs) / wall for p in ("draft", "target", "verify")}
    shares["other"] = max(0.0, 1.0 - sum(shares.values()))
    return shares


def comparison_notes(rows: list[dict[str, Any]]) -> list[str]:
    """What the =plain column compares, for each engine in rows that is not checked against
    verispec's plain decoding (e.g. llamacpp: its greedy ids are reported, never compared)."""
    notes = []
    for name in dict.fromkeys(r["engine"] for r in rows):
        cls = ENGINES[name]
        if cls.reference is None:
            notes.append(f"note: {name} greedy ids are not compared (=plain '-'): {cls.note}")
        elif cls.reference != "verispec":
            notes.append(f"note: {name} =plain compares with {cls.reference} none: {cls.note}")
    return notes


def cost_ratio(alone: Measured, plain: Measured) -> float:
    """Draft cost per token over target cost per token: median inter-token gaps, same repeats."""

    def itl(m: Measured) -> float:
        return statistics.median(g for run in m.runs for r in run.requests for g in r.itl_s)

    return itl(alone) / itl(plain)


def mismatches(m: Measured, reference: Measured) -> int:
    """Requests whose token ids differ from verispec plain decoding's (in any repeat)."""
    expected = [r.token_ids for r in reference.runs[0].requests]
    return sum(
        any(run.requests[i].token_ids != ids for run in m.runs) for i, ids in enumerate(expected)
    )
