"""Hugging Face transformers as a benchmark engine: generate() plain, with assisted generation
(reported as a draft-model method) or with its prompt lookup (reported as ngram)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch

from verispec.bench.engines import BatchRun, MethodSpec, RequestRun, Sampling, gaps
from verispec.drafters.registry import PLAIN, takes_draft_model
from verispec.types.stats import SpecStats


class TransformersEngine:
    """transformers' generate: plain, assisted generation (assistant_model) or prompt lookup."""

    engine = "transformers"
    reference: ClassVar[str | None] = "verispec"
    note: ClassVar[str] = ""
    drafts_with_models: ClassVar[bool] = True

    def __init__(
        self, target: Path, draft: Path | None, spec: MethodSpec, dtype: str, device: str = "cpu"
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.method, self.k = spec.method, spec.k
        torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
        self.model = _from_pretrained(AutoModelForCausalLM, target, dtype=torch_dtype).eval()
        self.model.to(device)
        self.options: dict[str, Any] = {}
        if takes_draft_model(spec.method):
            if draft is None:
                raise ValueError(f"method {spec.method} needs a draft checkpoint")
            assistant = _from_pretrained(AutoModelForCausalLM, draft, dtype=torch_dtype).eval()
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
        return RequestRun(token_ids, ttft, gaps(times)[: max(0, len(token_ids) - 1)], stats)


def hf_location(model: Path) -> tuple[str, dict[str, str]]:
    """Where transformers' from_pretrained finds a model: a checkpoint directory as is, a GGUF
    file as its directory and gguf_file= (its weights dequantized to float at load)."""
    if model.suffix == ".gguf":
        return str(model.parent), {"gguf_file": model.name}
    return str(model), {}


def _from_pretrained(cls: Any, model: Path, **options: Any) -> Any:
    where, gguf = hf_location(model)
    return cls.from_pretrained(where, **gguf, **options)


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
