"""The benchmark plan: what to run (BenchConfig), which engines exist, and the groups of
configurations compared side by side (a group is a workload, a temperature and a concurrency).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verispec.bench.engines import (
    HEAD_METHODS,
    MethodSpec,
    TreeShape,
    VerispecA8Engine,
    VerispecEngine,
    VerispecFp16Engine,
)
from verispec.bench.hf_engine import TransformersEngine
from verispec.bench.llamacpp_engine import LlamaCppEngine, llama_cpp_missing
from verispec.bench.workloads import WORKLOADS
from verispec.drafters.registry import PLAIN, method_names, takes_draft_model, takes_head
from verispec.drafters.registry import method as method_traits

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


def home_workloads() -> dict[str, str]:
    """The workload each method is made for: draft models and heads on `code`, prompt lookup
    on `edit`."""
    return {m: "code" if takes_draft_model(m) or takes_head(m) else "edit" for m in method_names()}


def own_tree(spec: MethodSpec) -> bool:
    """Whether spec's method drafts trees of its own shape (suffix decoding)."""
    return spec.method != PLAIN and method_traits(spec.method).own_tree


def own_layers(spec: MethodSpec) -> bool:
    """Whether spec's method drafts with the target's own layers (self-speculation)."""
    return spec.method != PLAIN and method_traits(spec.method).drafts_with_own_layers
