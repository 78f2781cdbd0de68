"""What verification costs: the curve of one target forward over q new tokens on a warm cache,
and a benchmark pass's cost of one speculative step relative to a plain one.

Speculative decoding pays only if checking q = 1 + k tokens (or a tree's nodes + 1) costs
about what producing one does; the curve measures that ratio, t(q) / t(1), directly in
verispec's runtime; step_cost_ratio reads it, draft included, from a run's phase times. The
acceptance and step-cost models that turn these into predicted speedups are spec/cost.py's,
shared with the adaptive policy and self-speculation's calibration.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from verispec.bench.engines import BatchRun
from verispec.models.config import ModelConfig
from verispec.models.kernels.backends import choose_backend
from verispec.models.llama import LlamaModel
from verispec.models.paged import PagedModel, append_chunk
from verispec.models.weights.loader import build_model, load_model
from verispec.paths import cache_dir

QS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class VerifyCost:
    """One point of the curve."""

    model: str  # a label, e.g. "embedded-target"
    q: int
    ms: float  # median time of one forward over q new tokens
    ratio: float  # ms / ms at q = 1


def verify_cost_curve(
    model: Path | LlamaModel,
    label: str,
    qs: tuple[int, ...] = QS,
    context: int = 256,
    repeats: int = 10,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> list[VerifyCost]:
    """Median forward time for each q over `repeats` rounds (q values interleaved within each
    round), each forward on top of the same warm `context`-token cache, logits for all q rows
    (as verification needs). model: a checkpoint directory (loaded with the default linear
    backend) or a loaded model. q = 1 must be among qs (the ratio's denominator)."""
    if 1 not in qs:
        raise ValueError("qs must include 1, the denominator of the ratios")
    if isinstance(model, Path):
        model = load_model(model, dtype, torch.device(device))
    ms = step_ms({label: model}, qs, context, repeats)
    return [VerifyCost(label, q, ms[label, q], ms[label, q] / ms[label, 1]) for q in qs]


def step_ms(
    models: dict[str, LlamaModel], qs: tuple[int, ...], context: int, repeats: int
) -> dict[tuple[str, int], float]:
    """Median time in ms of one forward over q new tokens (logits for all q rows) for each
    (model name, q), every forward on top of the model's same warm `context`-token cache (rolled
    back after it, as a rejected draft would be). Models and q values take turns within each of
    `repeats` rounds (round 0 warms every shape up), so that a ratio of two of them compares
    steps taken under the same machine conditions."""
    block_size = 16
    num_blocks = (context + max(qs)) // block_size + 2
    paged = {name: PagedModel(m, num_blocks, block_size) for name, m in models.items()}
    tables = {name: p.new_table() for name, p in paged.items()}
    gen = torch.Generator().manual_seed(0)
    vocab = min(m.config.vocab_size for m in models.values())
    ids = torch.randint(3, vocab, (context + max(qs),), generator=gen).tolist()
    times: dict[tuple[str, int], list[float]] = {(n, q): [] for n in models for q in qs}
    with torch.inference_mode():
        for name, p in paged.items():  # the warm cache every measurement builds on
            p.forward([append_chunk(tables[name], ids[:context], 1)])
        for round_ in range(repeats + 1):
            for (name, q), samples in times.items():
                started = time.perf_counter()
                paged[name].forward([append_chunk(tables[name], ids[context : context + q], q)])
                if models[name].device.type != "cpu":
                    torch.cuda.synchronize()
                elapsed = time.perf_counter() - started
                tables[name].truncate(context)
                if round_:
                    samples.append(elapsed)
    return {key: 1e3 * statistics.median(samples) for key, samples in times.items()}


@dataclass(frozen=True, slots=True)
class PassTimes:
    """What the step-cost model reads from passes over the prompts (summed over repeats)."""

    forward_s: float  # seconds in the draft and target phases of the engine's steps
    prefill_s: float  # seconds to each request's first token (its prompt's forward), summed
    decode_tokens: int  # output tokens after each request's first
    verify_steps: int  # steps that verified drafts (0 for plain decoding)
    accepted: int  # draft tokens accepted in those steps
    decode_steps: int = 0  # timed plain decode steps (StepTimes.kinds["decode"])
    decode_s: float = 0.0  # their draft + target seconds
    verify_timed: int = 0  # timed steps that verified drafts, every request (kinds["verify"])
    verify_s: float = 0.0  # their draft + target seconds

    @classmethod
    def of(cls, runs: Sequence[BatchRun]) -> PassTimes | None:
        """From verispec passes (None when an engine kept no phase times)."""
        phases = [run.phases for run in runs]
        if any(p is None for p in phases):
            return None
        stats = [r.spec for run in runs for r in run.requests]
        kinds = [run.kinds or {} for run in runs]

        def kind(name: str, i: int) -> float:
            return sum(k.get(name, [0, 0.0])[i] for k in kinds)

        return cls(
            forward_s=sum(p["draft"] + p["target"] for p in phases if p is not None),
            prefill_s=sum(r.ttft_s for run in runs for r in run.requests),
            decode_tokens=sum(max(0, len(r.token_ids) - 1) for run in runs for r in run.requests),
            verify_steps=sum(s.num_verify_steps for s in stats),
            accepted=sum(s.num_accepted_tokens for s in stats),
            decode_steps=int(kind("decode", 0)), decode_s=kind("decode", 1),
            verify_timed=int(kind("verify", 0)), verify_s=kind("verify", 1),
        )


MIN_TIMED_STEPS = 8
"""Fewest timed steps of a kind whose mean step_cost_ratio trusts."""


def step_cost_ratio(spec: PassTimes, plain: PassTimes) -> float | None:
    """Cost of one speculative step (its draft, then the target forward over the q = drafts + 1
    rows it verifies) over one plain decode step (a 1-row forward). None when there is nothing
    to divide or a time comes out <= 0 (too short a run).

    Where the engine timed steps by kind (StepTimes.kinds): a verify step's mean time over a
    plain decode step's, both from the speculative pass itself when it has at least
    MIN_TIMED_STEPS steps without drafts (steps taken minutes apart differ by 10-20% on a
    shared machine), else the plain pass's. Example: 93 verify steps in 1.063 s, 431 steps
    without drafts in 3.763 s: 11.43 / 8.73 ms = 1.31.

    Otherwise, from phase totals with the prompts' forwards (time to first token) taken out.
    Plain: t1 = (forward_s - prefill_s) / decode_tokens. Spec: steps that verified no draft
    (decode_tokens - verify_steps - accepted of them, one token each) are charged t1; the rest
    is spread over verify_steps. Example: plain 96 decode tokens, 2.0 s with 0.08 s prefill:
    t1 = 0.02 s; spec 96 decode tokens, 30 verify steps accepting 60 (so 6 steps without
    drafts), 1.0 s with 0.08 s prefill: (1.0 - 0.08 - 6 * 0.02) / 30 = 0.0267 s a step, ratio
    1.33.
    """
    if spec.verify_timed >= MIN_TIMED_STEPS:
        own = spec.decode_steps >= MIN_TIMED_STEPS
        base = spec if own else plain
        if base.decode_steps >= MIN_TIMED_STEPS and base.decode_s > 0:
            return (spec.verify_s / spec.verify_timed) / (base.decode_s / base.decode_steps)
    if not plain.decode_tokens or not spec.verify_steps:
        return None
    t1 = (plain.forward_s - plain.prefill_s) / plain.decode_tokens
    undrafted = max(0, spec.decode_tokens - spec.verify_steps - spec.accepted)
    step = (spec.forward_s - spec.prefill_s - undrafted * t1) / spec.verify_steps
    return step / t1 if t1 > 0 and step > 0 else None


def step_predicted_speedup(length: float | None, ratio: float | None) -> float | None:
    """Tokens per verify step over the step's cost relative to a plain step (which yields one
    token): what the draft and the forwards alone allow. E.g. length 3.0, ratio 1.33: 2.25."""
    if length is None or ratio is None:
        return None
    return length / ratio


def random_llama_125m(dtype: str = "float32") -> Path:
    """A random-weight Llama of the ~125M shape (hidden 768, 12 layers, 12 heads, MLP 3072,
    vocab 32000, untied head; 162M parameters), seed 0, with the embedded models' 8192-token
    tokenizer (ids beyond it are never produced by text), made once in the cache.
    dtype "float16" saves the same weights rounded to float16 (a half-size checkpoint, as
    most published ones are 16-bit), in its own directory."""
    import os
    import shutil

    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from verispec.models.catalog.default import embedded_model_path

    if dtype not in ("float32", "float16"):
        raise ValueError(f"dtype must be float32 or float16, got {dtype!r}")
    suffix = "" if dtype == "float32" else "-fp16"
    path = cache_dir() / "bench" / f"llama-125m-random{suffix}"  # verispec's cache
    if (path / "config.json").is_file() and (path / "tokenizer.json").is_file():
        return path
    print(f"creating {path} (random weights, once) ...", file=sys.stderr, flush=True)
    config = LlamaConfig(
        vocab_size=32000, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
        num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=2048,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    LlamaForCausalLM(config).to(getattr(torch, dtype)).save_pretrained(str(tmp))
    GenerationConfig(bos_token_id=0, eos_token_id=1, pad_token_id=2).save_pretrained(str(tmp))
    tokenizer = embedded_model_path("target")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / name, tmp / name)
    shutil.rmtree(path, ignore_errors=True)  # an older, incomplete copy
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(path)
    return path


LLAMA_1B = {  # the shape of TinyLlama-1.1B: 1.10B parameters
    "architectures": ["LlamaForCausalLM"], "vocab_size": 32000, "hidden_size": 2048,
    "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32,
    "num_key_value_heads": 4, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "tie_word_embeddings": False,
}  # fmt: skip


def random_llama(shape: dict[str, object], seed: int = 0) -> LlamaModel:
    """A float32 CPU Llama of the given config.json fields with transformers' random init
    (seeded, global RNG untouched), built in memory: a ~1B shape costs 4.4 GB of RAM but
    nothing on disk."""
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        hf = LlamaForCausalLM(LlamaConfig(**shape))
    config = ModelConfig.from_dict(hf.config.to_dict())
    weights = {name: t.detach() for name, t in hf.state_dict().items()}
    del hf
    backend = choose_backend("auto", torch.device("cpu"), torch.float32)
    return build_model(config, weights, backend, source="random llama")
