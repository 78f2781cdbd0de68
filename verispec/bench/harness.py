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
    HEAD_METHODS,
    BatchRun,
    Engine,
    MethodSpec,
    Sampling,
    TreeShape,
    VerispecA8Engine,
    VerispecEngine,
    VerispecFp16Engine,
)
from verispec.bench.hf_engine import TransformersEngine
from verispec.bench.llamacpp_engine import LlamaCppEngine, llama_cpp_missing
from verispec.bench.verify_cost import (
    PassTimes,
    alpha_from_length,
    predicted_speedup,
    step_cost_ratio,
    step_predicted_speedup,
)
from verispec.bench.workloads import WORKLOADS, BenchPrompt
from verispec.drafters.registry import PLAIN, method_names, takes_draft_model, takes_head
from verispec.drafters.registry import method as method_traits
from verispec.engine.stats import SpecStats

ENGINES: dict[str, Any] = {
    e.engine: e
    for e in (VerispecEngine, VerispecFp16Engine, VerispecA8Engine, TransformersEngine,
              LlamaCppEngine)
}
OPTIONAL = {"llamacpp": llama_cpp_missing}  # engine -> why it cannot run here (None: it can)
DRAFT_ALONE = "draft-alone"  # a plain run of the draft model, for the draft/target cost ratio
PLAIN_SPEC, DRAFT_SPEC = MethodSpec(), MethodSpec(DRAFT_ALONE)
Key = tuple[str, MethodSpec]  # (engine, configuration)


def chain_methods() -> tuple[str, ...]:
    """The methods run by default: every registry method that needs no head (see heads), but
    self-speculation, whose calibration at load takes a minute on a real model (ask for it:
    --methods self)."""
    return tuple(m for m in method_names()
                 if not takes_head(m) and not method_traits(m).drafts_with_own_layers)  # fmt: skip


@dataclass
class BenchConfig:
    """What to run; every field is printed beside the figures."""

    target: Path
    draft: Path
    workloads: tuple[str, ...] = ("code", "edit", "free")
    methods: tuple[str, ...] = field(default_factory=chain_methods)
    ks: tuple[int, ...] = (2, 4, 8)
    heads: dict[str, Path] = field(default_factory=dict)  # head method -> its head directory
    trees: tuple[TreeShape, ...] = ()  # run by head methods besides each k's chain
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
    draft_quantization: str | None = None  # draft models' (resolved: "auto" is never kept)

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
        self._check_heads()

    def _check_heads(self) -> None:
        """A head method runs with its head; a head or tree shapes no method uses are errors."""
        for name in self.methods:
            if takes_head(name) and name not in self.heads:
                raise ValueError(f"method {name} needs a head directory: give --{name} PATH")
        for name in self.heads:
            if name not in HEAD_METHODS:
                raise ValueError(f"heads are for {', '.join(HEAD_METHODS)}; got {name!r}")
            if name not in self.methods:
                raise ValueError(f"--{name} is given but {name} is not among the methods "
                                 f"({','.join(self.methods)})")  # fmt: skip
        if self.trees and not any(takes_head(m) for m in self.methods):
            raise ValueError(f"--trees applies to {' and '.join(HEAD_METHODS)} only; "
                             "neither is among the methods")  # fmt: skip


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
            specs = tuple(s for m in methods for s in method_specs(m, config))
            for c in config.concurrency:
                groups.append(Group(workload, temperature, c, specs))
    return groups


def method_specs(method: str, config: BenchConfig) -> list[MethodSpec]:
    """A method's configurations: a chain of each k, and for a head method each tree shape
    (k = its node budget; shapes with a grafted lookup only for methods that graft)."""
    specs = [MethodSpec(method, k) for k in config.ks]
    if takes_head(method):
        grafts = method_traits(method).grafts_lookup
        specs += [MethodSpec(method, t.nodes, tree=t) for t in config.trees
                  if grafts or not t.lookup]  # fmt: skip
    return specs


@dataclass
class Measured:
    """All repeats of one configuration in one group; ran: the shape the engine ran."""

    engine: str
    spec: MethodSpec
    ran: MethodSpec
    runs: list[BatchRun] = field(default_factory=list)
    plain_runs: list[BatchRun] = field(default_factory=list)  # same engine, same repeats


def run_group(
    group: Group,
    engines: dict[Key, Engine],
    prompts: list[list[int]],
    sampling: Sampling,
    repeats: int,
    tick: Callable[[], None] = lambda: None,
) -> list[Measured]:
    """Run a group's configurations interleaved: per repeat, every engine's plain run, then its
    speculative ones (and its draft alone), each over all prompts; a warm-up round first."""
    order = [key for key in engines if key[1] == PLAIN_SPEC]
    order += [key for key in engines if key[1] != PLAIN_SPEC and _in_group(key[1], group)]
    measured = {key: Measured(*key, getattr(engines[key], "spec", key[1])) for key in order}
    for repeat in range(repeats + 1):
        results = {key: engines[key].run(prompts, sampling, group.concurrency) for key in order}
        tick()
        if repeat == 0:
            continue  # warm-up
        for key, run in results.items():
            measured[key].runs.append(run)
            measured[key].plain_runs.append(results[(key[0], PLAIN_SPEC)])
    return list(measured.values())


def _in_group(spec: MethodSpec, group: Group) -> bool:
    if spec == DRAFT_SPEC:  # needed for the cost ratio of draft-model rows only
        return any(takes_draft_model(m.method) for m in group.methods)
    return spec in group.methods


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
    if takes_head(spec.method) or _own_tree(spec) or _own_layers(spec):  # from the step times
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


def home_workloads() -> dict[str, str]:
    """The workload each method is made for: draft models and heads on `code`, prompt lookup
    on `edit`."""
    return {m: "code" if takes_draft_model(m) or takes_head(m) else "edit" for m in method_names()}


def load_engines(config: BenchConfig, progress: Callable[[str], None]) -> dict[Key, Engine]:
    """Every engine the plan needs, keyed (engine, configuration); plain and draft-alone
    included. An optional engine that cannot run here is skipped, and an engine runs no
    draft-model method unless it drafts with models and no head method unless it runs heads;
    each with a note through progress, as is a shape a drafter runs shallower than asked."""
    groups = plan_groups(config, home_workloads())
    needed = list(dict.fromkeys(m for g in groups for m in g.methods))
    engines: dict[Key, Engine] = {}
    for name in config.engines:
        cls = ENGINES[name]
        missing = OPTIONAL[name]() if name in OPTIONAL else None
        if missing is not None:
            progress(f"note: skipping engine {name}: {missing}")
            continue
        runs_heads = getattr(cls, "runs_heads", False)
        specs = [s for s in needed if cls.drafts_with_models or not takes_draft_model(s.method)]
        if len(specs) < len(needed):
            progress(f"note: engine {name} runs no draft-model method; it has no rows for them")
        if not runs_heads and any(takes_head(s.method) for s in specs):
            specs = [s for s in specs if not takes_head(s.method)]
            progress(f"note: engine {name} runs no head method; it has no rows for them")
        if not getattr(cls, "runs_own_trees", False) and any(_own_tree(s) for s in specs):
            specs = [s for s in specs if not _own_tree(s)]
            progress(f"note: engine {name} runs no suffix-tree method; it has no rows for them")
        if not getattr(cls, "runs_own_layers", False) and any(_own_layers(s) for s in specs):
            specs = [s for s in specs if not _own_layers(s)]
            progress(f"note: engine {name} runs no self-speculation; it has no rows for it")
        progress(f"loading {name} engines ...")
        engines[(name, PLAIN_SPEC)] = cls(config.target, None, PLAIN_SPEC, config.dtype)
        rounds_drafts = getattr(cls, "rounds_drafts", False)
        rounds = {"draft_quantization": config.draft_quantization} if rounds_drafts else {}
        if any(takes_draft_model(s.method) for s in specs):
            alone = {**rounds, "alone": True} if rounds_drafts else {}
            engines[(name, DRAFT_SPEC)] = cls(config.draft, None, PLAIN_SPEC, config.dtype,
                                              **alone)  # fmt: skip
        for spec in specs:
            draft = config.heads[spec.method] if takes_head(spec.method) else config.draft
            engine = engines[(name, spec)] = cls(config.target, draft, spec, config.dtype, **rounds)
            ran = getattr(engine, "spec", spec)
            if ran != spec:
                progress(f"note: {name} {spec.method} {spec.label} runs as {ran.label} (its "
                         "drafter drafts no deeper)")  # fmt: skip
    return engines


def _own_tree(spec: MethodSpec) -> bool:
    """Whether spec's method drafts trees of its own shape (suffix decoding)."""
    return spec.method != PLAIN and method_traits(spec.method).own_tree


def _own_layers(spec: MethodSpec) -> bool:
    """Whether spec's method drafts with the target's own layers (self-speculation)."""
    return spec.method != PLAIN and method_traits(spec.method).drafts_with_own_layers


def run_bench(
    config: BenchConfig,
    tokenize: Callable[[BenchPrompt], list[int]],
    progress: Callable[[str], None] = lambda _: None,
    tick_total: Callable[[int], Callable[[], None]] = lambda _: lambda: None,
) -> list[dict[str, Any]]:
    """Run every group of the plan; one row per (engine, configuration) per group. Prompts are
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
        by_key = {(m.engine, m.spec): m for m in measured}
        for m in measured:
            if m.spec == DRAFT_SPEC:
                continue
            alone = by_key.get((m.engine, DRAFT_SPEC))
            cost = _cost_ratio(alone, by_key[(m.engine, PLAIN_SPEC)]) if alone else None
            row = summarise(m, group, sampling, config, cost)
            reference = by_key.get((ENGINES[m.engine].reference, PLAIN_SPEC))
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
