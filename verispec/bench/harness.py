"""Running the benchmark plan (bench/plan.py): every configuration runs interleaved with plain
decoding of the same engine, so each speedup is a ratio measured side by side; bench/summary.py
makes the rows.

A group is (workload, temperature). In each repeat, every configuration of a group runs once
over the group's prompts, in a fixed order (each engine's plain run first), after one warm-up
pass. Speedup = median over repeats of (configuration tokens/s / same engine's plain tokens/s
in the same repeat).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verispec.bench.engines import (
    BenchEngine,
    MethodSpec,
    Sampling,
    VerispecEngine,
)
from verispec.bench.plan import (
    DRAFT_SPEC,
    ENGINES,
    OPTIONAL,
    PLAIN_SPEC,
    BenchConfig,
    Group,
    Key,
    home_workloads,
    own_layers,
    own_tree,
    plan_groups,
)
from verispec.bench.summary import Measured, cost_ratio, mismatches, summarise
from verispec.bench.workloads import WORKLOADS, BenchPrompt
from verispec.drafters.registry import takes_draft_model, takes_head


def run_group(
    group: Group,
    engines: dict[Key, BenchEngine],
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


def load_engines(config: BenchConfig, progress: Callable[[str], None]) -> dict[Key, BenchEngine]:
    """Every engine the plan needs, keyed (engine, configuration); plain and draft-alone
    included. An optional engine that cannot run here is skipped, and an engine runs no
    draft-model method unless it drafts with models and no head method unless it runs heads;
    each with a note through progress, as is a shape a drafter runs shallower than asked."""
    groups = plan_groups(config, home_workloads())
    needed = list(dict.fromkeys(m for g in groups for m in g.methods))
    engines: dict[Key, BenchEngine] = {}
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
        if not getattr(cls, "runs_own_trees", False) and any(own_tree(s) for s in specs):
            specs = [s for s in specs if not own_tree(s)]
            progress(f"note: engine {name} runs no suffix-tree method; it has no rows for them")
        if not getattr(cls, "runs_own_layers", False) and any(own_layers(s) for s in specs):
            specs = [s for s in specs if not own_layers(s)]
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
            cost = cost_ratio(alone, by_key[(m.engine, PLAIN_SPEC)]) if alone else None
            row = summarise(m, group, sampling, config, cost)
            reference = by_key.get((ENGINES[m.engine].reference, PLAIN_SPEC))
            row["greedy_mismatches"] = mismatches(m, reference) if greedy and reference else None
            rows.append(row)
    return rows
