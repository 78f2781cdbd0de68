"""The engines a benchmark runs side by side: verispec and Hugging Face transformers.

Both take token-id prompts and return per-request timings (TTFT apart from inter-token gaps)
and acceptance counters, so one report describes either. Method names come from the registry
(PLAIN for plain decoding); transformers' assisted generation counts as a draft-model method
and its prompt lookup as an n-gram one.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from verispec.drafters.registry import PLAIN, takes_draft_model
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

    engine: str  # "verispec" or "transformers"
    method: str  # PLAIN or a registry name
    k: int  # draft tokens per step (0 for plain)

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

    def __init__(
        self, target: Path, draft: Path | None, spec: MethodSpec, dtype: str, device: str = "cpu"
    ) -> None:
        from verispec import LLM, SpecConfig

        self.method, self.k = spec.method, spec.k
        speculative = None
        if spec.method != PLAIN:
            speculative = SpecConfig(
                method=spec.method, num_speculative_tokens=spec.k,
                model=str(draft) if takes_draft(spec.method) else None,
                prompt_lookup_min=spec.prompt_lookup_min, prompt_lookup_max=spec.prompt_lookup_max,
            )  # fmt: skip
        self.llm = LLM(model=str(target), dtype=dtype, device=device, speculative=speculative)

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


class TransformersEngine:
    """transformers' generate: plain, assisted generation (assistant_model) or prompt lookup."""

    engine = "transformers"

    def __init__(
        self, target: Path, draft: Path | None, spec: MethodSpec, dtype: str, device: str = "cpu"
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.method, self.k = spec.method, spec.k
        torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
        self.model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch_dtype).eval()
        self.model.to(device)
        self.options: dict[str, Any] = {}
        if spec.method != PLAIN and takes_draft(spec.method):
            if draft is None:
                raise ValueError(f"method {spec.method} needs a draft checkpoint")
            assistant = AutoModelForCausalLM.from_pretrained(str(draft), dtype=torch_dtype).eval()
            assistant.to(device)
            # a fixed k, as verispec uses (transformers' default schedule adapts it per step)
            assistant.generation_config.num_assistant_tokens = spec.k
            assistant.generation_config.num_assistant_tokens_schedule = "constant"
            assistant.generation_config.assistant_confidence_threshold = 0.0
            self.options["assistant_model"] = assistant
        elif spec.method != PLAIN:
            self.options["prompt_lookup_num_tokens"] = spec.k
            self.options["max_matching_ngram_size"] = spec.prompt_lookup_max

    def run(self, prompts: list[list[int]], sampling: Sampling, concurrency: int) -> BatchRun:
        if concurrency != 1:
            raise ValueError("transformers' speculative generate takes one prompt at a time")
        runs: list[RequestRun] = []
        started = time.perf_counter()
        for i, prompt in enumerate(prompts):
            runs.append(self._one(prompt, sampling, sampling.seed + i))
        return BatchRun(runs, time.perf_counter() - started)

    def _one(self, prompt: list[int], sampling: Sampling, seed: int) -> RequestRun:
        ids = torch.tensor([prompt], device=self.model.device)
        streamer = _TimingStreamer()
        sample = sampling.temperature > 0
        options = dict(temperature=sampling.temperature, top_p=sampling.top_p) if sample else {}
        torch.manual_seed(seed)
        with torch.inference_mode(), _count_acceptance() as stats:
            started = time.perf_counter()
            out = self.model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=sample, top_k=None,
                max_new_tokens=sampling.max_tokens, streamer=streamer,
                pad_token_id=self.model.config.eos_token_id, **options, **self.options,
            )  # fmt: skip
        token_ids = out[0, len(prompt) :].tolist()
        times = streamer.times[1:]  # generate() puts the prompt first
        ttft = times[0][0] - started
        gaps: list[float] = [0.0] * (times[0][1] - 1)  # tokens of one step share its time
        for (before, _), (now, n) in itertools.pairwise(times):
            gaps += [now - before] + [0.0] * (n - 1)
        return RequestRun(token_ids, ttft, gaps[: max(0, len(token_ids) - 1)], stats)


def takes_draft(method: str) -> bool:
    """Whether a registry method drafts with a draft model."""
    return takes_draft_model(method)


class _TimingStreamer:
    """Records time.perf_counter() at each put() (transformers' streamer protocol)."""

    def __init__(self) -> None:
        self.times: list[tuple[float, int]] = []  # (time, tokens put)

    def put(self, value: torch.Tensor) -> None:
        self.times.append((time.perf_counter(), value.numel()))

    def end(self) -> None:
        pass


@contextlib.contextmanager
def _count_acceptance() -> Iterator[SpecStats]:
    """Count drafted and accepted tokens of transformers' speculative steps into a SpecStats:
    each get_candidates() call proposes len(candidates) - len(input) tokens, and the following
    update_candidate_strategy() call reports how many of them were accepted. The methods are
    wrapped only inside this context."""
    from transformers.generation import candidate_generator as cg

    stats, drafted = SpecStats(), []
    proposers = (cg.AssistedCandidateGenerator, cg.PromptLookupCandidateGenerator)
    updaters = (cg.CandidateGenerator, cg.AssistedCandidateGenerator)
    saved = [(c, "get_candidates", c.__dict__["get_candidates"]) for c in proposers]
    saved += [
        (c, "update_candidate_strategy", c.__dict__["update_candidate_strategy"]) for c in updaters
    ]

    def counting_get(fn: Any) -> Any:
        def get_candidates(self: Any, input_ids: torch.Tensor, **kw: Any) -> Any:
            candidates, logits = fn(self, input_ids, **kw)
            drafted.append(candidates.shape[1] - input_ids.shape[1])
            return candidates, logits

        return get_candidates

    def counting_update(fn: Any) -> Any:
        def update(self: Any, input_ids: torch.Tensor, scores: torch.Tensor, matches: int) -> Any:
            if drafted:  # once per step, even where one update calls another
                stats.record(drafted.pop(), int(matches))
            return fn(self, input_ids, scores, matches)

        return update

    try:
        for cls, name, fn in saved:
            wrap = counting_get if name == "get_candidates" else counting_update
            setattr(cls, name, wrap(fn))
        yield stats
    finally:
        for cls, name, fn in saved:
            setattr(cls, name, fn)
