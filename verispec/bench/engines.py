"""What every benchmark engine shares (prompts in, per-request timings out), and verispec's
engine; transformers' is in hf_engine, llama.cpp's in llamacpp_engine.

All engines take token-id prompts and return per-request timings (TTFT apart from inter-token gaps)
and acceptance counters, so one report describes any. Method names come from the registry
(PLAIN for plain decoding); transformers' assisted generation counts as a draft-model method
and its prompt lookup as an n-gram one. A model is a checkpoint directory or a GGUF file.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from verispec.drafters.registry import PLAIN, method, takes_draft_model
from verispec.metrics import SpecStats, StepTimes


@dataclass
class RequestRun:
    """One request's output and timings."""

    token_ids: list[int]
    ttft_s: float
    itl_s: list[float]  # gap before each later token (tokens of one step share its time)
    spec: SpecStats = field(default_factory=SpecStats)


@dataclass
class BatchRun:
    """All prompts of a workload, run once."""

    requests: list[RequestRun]
    wall_s: float
    phases: dict[str, float] | None = None  # seconds per engine step phase (verispec only)

    @property
    def num_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.requests)

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.wall_s

    def spec_stats(self) -> SpecStats:
        total = SpecStats()
        for r in self.requests:
            total.merge(r.spec)
        return total


@dataclass(frozen=True)
class Sampling:
    """What every engine is asked to do for each prompt."""

    temperature: float
    top_p: float
    max_tokens: int
    seed: int = 0  # request i uses seed + i


class Engine(Protocol):
    """A loaded engine with one decoding method."""

    engine: str  # "verispec", "transformers", ...
    method: str  # PLAIN or a registry name
    k: int  # draft tokens per step (0 for plain)
    reference: ClassVar[str | None]  # engine whose plain greedy ids these must equal (None: none)
    note: ClassVar[str]  # why, where reference is not verispec
    drafts_with_models: ClassVar[bool]  # whether it runs the draft-model methods

    def run(self, prompts: list[list[int]], sampling: Sampling, concurrency: int) -> BatchRun: ...


@dataclass(frozen=True)
class MethodSpec:
    """A decoding method to benchmark: PLAIN, or a registry method with k and its options."""

    method: str = PLAIN
    k: int = 0
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4


class VerispecEngine:
    """verispec's LLM with one speculative configuration."""

    engine = "verispec"
    reference: ClassVar[str | None] = "verispec"
    note: ClassVar[str] = ""
    drafts_with_models: ClassVar[bool] = True
    quantization: ClassVar[str | None] = None  # of the target's linear weights

    def __init__(
        self, target: Path, draft: Path | None, spec: MethodSpec, dtype: str, device: str = "cpu"
    ) -> None:
        from verispec import LLM, SpecConfig

        self.method, self.k = spec.method, spec.k
        speculative = None
        if spec.method != PLAIN:  # each method is given only the options it reads
            options: dict[str, Any] = {}
            if takes_draft(spec.method):
                options["model"] = str(draft)
            if method(spec.method).takes_prompt_lookup:
                options["prompt_lookup_min"] = spec.prompt_lookup_min
                options["prompt_lookup_max"] = spec.prompt_lookup_max
            speculative = SpecConfig(method=spec.method, num_speculative_tokens=spec.k, **options)
        self.llm = LLM(
            model=str(target), dtype=dtype, device=device, speculative=speculative,
            quantization=self.quantization,
        )  # fmt: skip

    def run(self, prompts: list[list[int]], sampling: Sampling, concurrency: int) -> BatchRun:
        from verispec import SamplingParams

        runs: list[RequestRun] = []
        self.llm.engine.step_times = StepTimes()
        started = time.perf_counter()
        for first in range(0, len(prompts), concurrency):
            chunk = prompts[first : first + concurrency]
            params = [
                SamplingParams(
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    max_tokens=sampling.max_tokens,
                    seed=sampling.seed + first + i,
                )
                for i in range(len(chunk))
            ]
            for out in self.llm.generate(chunk, params):
                m = out.metrics
                runs.append(RequestRun(out.token_ids, m.ttft_s or 0.0, list(m.itl_s), m.spec))
        wall = time.perf_counter() - started
        return BatchRun(runs, wall, dict(self.llm.engine.step_times.seconds))


class VerispecFp16Engine(VerispecEngine):
    """verispec with the target's linear weights rounded to float16 (the fp16 kernel runs
    them); lossless with respect to those weights, so compared with its own plain decoding."""

    engine = "verispec-fp16"
    reference: ClassVar[str | None] = "verispec-fp16"
    note: ClassVar[str] = "weights rounded to float16: its ids may differ from verispec's"
    quantization: ClassVar[str | None] = "fp16"


def gaps(times: list[tuple[float, int]]) -> list[float]:
    """Inter-token gaps from (time, tokens emitted) events, the first event holding the first
    token; tokens of one event share its time: [(1.0, 1), (1.5, 3)] -> [0.5, 0.0, 0.0]."""
    out = [0.0] * (times[0][1] - 1)
    for (before, _), (now, n) in itertools.pairwise(times):
        out += [now - before] + [0.0] * (n - 1)
    return out


def takes_draft(method: str) -> bool:
    """Whether a registry method drafts with a draft model."""
    return takes_draft_model(method)
