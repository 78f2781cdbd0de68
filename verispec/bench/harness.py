"""The benchmark plan and its measurements: every configuration runs interleaved with plain
decoding of the same engine, so each speedup is a ratio measured side by side.

A group is (workload, temperature). In each repeat, every configuration of a group runs once
over the group's prompts, in a fixed order (each engine's plain run first), after one warm-up
pass. Speedup = median over repeats of (configuration tokens/s / same engine's plain tokens/s
in the same repeat).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from verispec.bench.engines import (
    BatchRun,
    Engine,
    MethodSpec,
    Sampling,
    VerispecEngine,
    VerispecFp16Engine,
    takes_draft,
)
from verispec.bench.hf_engine import TransformersEngine
from verispec.bench.llamacpp_engine import LlamaCppEngine, llama_cpp_missing
from verispec.bench.workloads import WORKLOADS, BenchPrompt
from verispec.drafters.registry import PLAIN, method_names
from verispec.metrics import SpecStats

ENGINES: dict[str, Any] = {
    e.engine: e for e in (VerispecEngine, VerispecFp16Engine, TransformersEngine, LlamaCppEngine)
}
OPTIONAL = {"llamacpp": llama_cpp_missing}  # engine -> why it cannot run here (None: it can)
DRAFT_ALONE = "draft-alone"  # a plain run of the draft model, for the draft/target cost ratio


@dataclass
class BenchConfig:
    """What to run; every field is printed beside the figures."""

    target: Path
    draft: Path
    workloads: tuple[str, ...] = ("code", "edit", "free")
    methods: tuple[str, ...] = field(default_factory=method_names)
    ks: tuple[int, ...] = (2, 4, 8)
    temperatures: tuple[float, ...] = (0.0, 1.0)
    top_p: float = 0.95  # used at temperature > 0 (greedy ignores it)
    prompts: int | None = 6  # per workload (spread over its file); None = the whole file
    max_tokens: int | None = None  # None = each workload's own
    repeats: int = 3
    concurrency: tuple[int, ...] = (1,)
    engines: tuple[str, ...] = ("verispec", "transformers")
    dtype: str = "float32"
    threads: int = 1
    plan: str = "full"  # "full": every method on every workload; "quick": each on its home

    def __post_init__(self) -> None:
        for name in self.workloads:
            if name not in WORKLOADS:
                raise ValueError(f"workload must be one of {', '.join(WORKLOADS)}; got {name!r}")
        for name in self.methods:
            if name not in (PLAIN, *method_names()):
                known = ", ".join((PLAIN, *method_names()))
                raise ValueError(f"method must be one of {known}; got {name!r}")
        for name in self.engines:
            if name not in ENGINES:
                raise ValueError(f"engine must be one of {', '.join(ENGINES)}; got {name!r}")
        if not self.ks or min(self.ks) < 1:
            raise ValueError(f"k values must be >= 1, got {self.ks}")
        if self.repeats < 1 or (self.prompts is not None and self.prompts < 1):
            raise ValueError("repeats and prompts must be >= 1")
        if any(t < 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be >= 0, got {self.temperatures}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError(f"concurrency values must be >= 1, got {self.concurrency}")


ANYWHERE = ("free", "chat")  # workloads that run every method in the quick plan


@dataclass(frozen=True)
class Group:
    """Prompts run under one sampling setting; the configurations compared within it."""

    workload: str
    temperature: float
    concurrency: int
    methods: tuple[MethodSpec, ...]  # the speculative configurations (plain is implied)


def plan_groups(config: BenchConfig, home: dict[str, str]) -> list[Group]:
    """The groups to run. `home` maps a method to the workload it is made for; in the quick
    plan each method runs only there, and every method on `free` and `chat` (which no method
    calls home). Temperature 0 is skipped for `free`, which is defined as sampled text. Plain
    decoding always runs (listing PLAIN among the methods changes nothing)."""
    groups = []
    for workload in config.workloads:
        temps = [t for t in config.temperatures if workload != "free" or t > 0]
        for temperature in temps:
            methods = [
                m for m in config.methods if m != PLAIN and (
                    config.plan == "full" or home.get(m) == workload or workload in ANYWHERE
                )
            ]  # fmt: skip
            specs = tuple(MethodSpec(m, k) for m in methods for k in config.ks)
            for c in config.concurrency:
                groups.append(Group(workload, temperature, c, specs))
    return groups


@dataclass
class Measured:
    """All repeats of one configuration in one group."""

    engine: str
    method: str
    k: int
    runs: list[BatchRun] = field(default_factory=list)
    plain_runs: list[BatchRun] = field(default_factory=list)  # same engine, same repeats


def run_group(
    group: Group,
    engines: dict[tuple[str, str, int], Engine],
    prompts: list[list[int]],
    sampling: Sampling,
    repeats: int,
    tick: Callable[[], None] = lambda: None,
) -> list[Measured]:
    """Run a group's configurations interleaved: per repeat, every engine's plain run, then its
    speculative ones (and its draft alone), each over all prompts; a warm-up round first."""
    order = [key for key in engines if key[1] == PLAIN]
    order += [key for key in engines if key[1] != PLAIN and _in_group(key, group)]
    measured = {key: Measured(*key) for key in order}
    for repeat in range(repeats + 1):
        results = {key: engines[key].run(prompts, sampling, group.concurrency) for key in order}
        tick()
        if repeat == 0:
            continue  # warm-up
        for key, run in results.items():
            measured[key].runs.append(run)
            measured[key].plain_runs.append(results[(key[0], PLAIN, 0)])
    return list(measured.values())


def _in_group(key: tuple[str, str, int], group: Group) -> bool:
    _, method, k = key
    if method == DRAFT_ALONE:  # needed for the cost ratio of draft-model rows only
        return any(takes_draft(m.method) for m in group.methods)
    return any(m.method == method and m.k == k for m in group.methods)


def summarise(
    m: Measured, group: Group, sampling: Sampling, config: BenchConfig, draft_cost: float | None
) -> dict[str, Any]:
    """One row of the report (field names as documented in docs/benchmarks.md)."""
    med = statistics.median
    ttfts = [r.ttft_s for run in m.runs for r in run.requests]
    itls = [g for run in m.runs for r in run.requests for g in r.itl_s]
    stats = SpecStats()
    for run in m.runs:
        stats.merge(run.spec_stats())
    speedup = med(
        a.tokens_per_s / b.tokens_per_s for a, b in zip(m.runs, m.plain_runs, strict=True)
    )
    k = m.k
    cost = 0.0 if m.method != PLAIN and not takes_draft(m.method) else draft_cost
    predicted = None
    if m.method != PLAIN and cost is not None:
        predicted = predicted_speedup(alpha_from_length(stats.mean_acceptance_length, k), k, cost)
    return {
        "engine": m.engine,
        "method": m.method,
        "k": k,
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
        "acceptance_rate": stats.acceptance_rate,
        "mean_acceptance_length": stats.mean_acceptance_length,
        "per_position_acceptance_rate": stats.per_position_acceptance_rate,
        "speedup": speedup if m.method != PLAIN else 1.0,
        "draft_cost_ratio": cost if m.method != PLAIN else None,
        "predicted_speedup": predicted,
        "time_fractions": _time_fractions(m),
    }


def _time_fractions(m: Measured) -> dict[str, float] | None:
    """Share of wall time in the draft, the target forward and verification, and `other`
    (scheduling, bookkeeping, and the Python around the steps); None for transformers."""
    if any(run.phases is None for run in m.runs):
        return None
    wall = sum(run.wall_s for run in m.runs)
    shares = {p: sum(run.phases[p] for run in m.runs) / wall for p in ("draft", "target", "verify")}
    shares["other"] = max(0.0, 1.0 - sum(shares.values()))
    return shares


def tokens_per_step(a: float, k: int) -> float:
    """Expected tokens per verify step when each draft is accepted with chance a given the ones
    before were: 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a). E.g. a = 0.5, k = 2: 1.75."""
    return k + 1 if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


def predicted_speedup(a: float | None, k: int, c: float) -> float | None:
    """Leviathan et al. (2023), eq. 1: (1 - a^(k+1)) / ((1 - a)(k c + 1)), with c the draft's
    cost per token relative to the target's. E.g. a = 0.5, k = 2, c = 0.25: 1.75 / 1.5."""
    if a is None:
        return None
    return tokens_per_step(a, k) / (k * c + 1)


def alpha_from_length(length: float | None, k: int) -> float | None:
    """The a for which tokens_per_step(a, k) equals a measured mean acceptance length (by
    bisection: tokens_per_step rises from 1 at a = 0 to k + 1 at a = 1)."""
    if length is None:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tokens_per_step(mid, k) < length else (lo, mid)
    return (lo + hi) / 2


def home_workloads() -> dict[str, str]:
    """The workload each method is made for: draft models on `code`, prompt lookup on `edit`."""
    return {m: "code" if takes_draft(m) else "edit" for m in method_names()}


def load_engines(
    config: BenchConfig, progress: Callable[[str], None]
) -> dict[tuple[str, str, int], Engine]:
    """Every engine the plan needs, keyed (engine, method, k); plain and draft-alone included.
    An optional engine that cannot run here is skipped, and an engine that drafts without
    models runs no draft-model method; both with a note through progress."""
    needed = {(m.method, m.k) for g in plan_groups(config, home_workloads()) for m in g.methods}
    engines: dict[tuple[str, str, int], Engine] = {}
    for name in config.engines:
        cls = ENGINES[name]
        missing = OPTIONAL[name]() if name in OPTIONAL else None
        if missing is not None:
            progress(f"note: skipping engine {name}: {missing}")
            continue
        methods = sorted(mk for mk in needed if cls.drafts_with_models or not takes_draft(mk[0]))
        if len(methods) < len(needed):
            progress(f"note: engine {name} runs no draft-model method; it has no rows for them")
        progress(f"loading {name} engines ...")
        engines[(name, PLAIN, 0)] = cls(config.target, None, MethodSpec(), config.dtype)
        if any(takes_draft(m) for m, _ in methods):
            engines[(name, DRAFT_ALONE, 0)] = cls(config.draft, None, MethodSpec(), config.dtype)
        for method, k in methods:
            engines[(name, method, k)] = cls(
                config.target, config.draft, MethodSpec(method, k), config.dtype
            )
    return engines


def run_bench(
    config: BenchConfig,
    tokenize: Callable[[BenchPrompt], list[int]],
    progress: Callable[[str], None] = lambda _: None,
    tick_total: Callable[[int], Callable[[], None]] = lambda _: lambda: None,
) -> list[dict[str, Any]]:
    """Run every group of the plan; one row per (engine, method, k) per group. Prompts are
    tokenized before any engine loads, so a prompt the model cannot take fails early."""
    token_ids = {
        name: [tokenize(p) for p in WORKLOADS[name].prompts(config.prompts)]
        for name in config.workloads
    }
    engines = load_engines(config, progress)
    groups = plan_groups(config, home_workloads())
    tick = tick_total(len(groups) * (config.repeats + 1))
    rows = []
    for group in groups:
        workload = WORKLOADS[group.workload]
        prompts = token_ids[group.workload]
        greedy = group.temperature == 0
        sampling = Sampling(
            temperature=group.temperature, top_p=1.0 if greedy else config.top_p,
            max_tokens=config.max_tokens or workload.max_tokens,
        )  # fmt: skip
        usable = {
            key: e for key, e in engines.items()
            if isinstance(e, VerispecEngine) or group.concurrency == 1
        }  # fmt: skip
        measured = run_group(group, usable, prompts, sampling, config.repeats, tick)
        by_key = {(m.engine, m.method, m.k): m for m in measured}
        for m in measured:
            if m.method == DRAFT_ALONE:
                continue
            alone = by_key.get((m.engine, DRAFT_ALONE, 0))
            cost = _cost_ratio(alone, by_key[(m.engine, PLAIN, 0)]) if alone else None
            row = summarise(m, group, sampling, config, cost)
            reference = by_key.get((ENGINES[m.engine].reference, PLAIN, 0))
            row["greedy_mismatches"] = _mismatches(m, reference) if greedy and reference else None
            rows.append(row)
    return rows


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


def _cost_ratio(alone: Measured, plain: Measured) -> float:
    """Draft cost per token over target cost per token: median inter-token gaps, same repeats."""

    def itl(m: Measured) -> float:
        return statistics.median(g for run in m.runs for r in run.requests for g in r.itl_s)

    return itl(alone) / itl(plain)


def _mismatches(m: Measured, reference: Measured) -> int:
    """Requests whose token ids differ from verispec plain decoding's (in any repeat)."""
    expected = [r.token_ids for r in reference.runs[0].requests]
    return sum(
        any(run.requests[i].token_ids != ids for run in m.runs) for i, ids in enumerate(expected)
    )
