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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol

from verispec.config import MAX_TREE_NODES, SpecConfig
from verispec.drafters.registry import PLAIN, head_method_names, method
from verispec.types.stats import SpecStats, StepTimes

HEAD_METHODS = head_method_names()
"""Registry methods that draft with a head over the target's features: SpecConfig.model is a
head directory (the bench's --eagle / --medusa), and they may draft trees."""
PREFIX_CACHING = "verispec on, emptied before each pass"
"""How the verispec engines cache prompt prefixes (llama.cpp keeps the previous prompt's)."""


@dataclass
class RequestRun:
    """One request's output and timings."""

    token_ids: list[int]
    ttft_s: float
    itl_s: list[float]  # gap before each later token (tokens of one step share its time)
    spec: SpecStats = field(default_factory=SpecStats)

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first (vLLM's TPOT): the request's time less its
        TTFT, over its later tokens; None for a request of one token. Speculation changes this
        and leaves TTFT alone, so this is the decoding speed it is measured by."""
        return sum(self.itl_s) / len(self.itl_s) if self.itl_s else None


@dataclass
class BatchRun:
    """All prompts of a workload, run once."""

    requests: list[RequestRun]
    wall_s: float
    phases: dict[str, float] | None = None  # seconds per engine step phase (verispec only)
    kinds: dict[str, list[float]] | None = None  # StepTimes.kinds (verispec only)

    @property
    def num_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.requests)

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.wall_s

    @property
    def tpot_s(self) -> float | None:
        """Mean TPOT over the requests of more than one token (None: there are none)."""
        tpots = [t for t in (r.tpot_s for r in self.requests) if t is not None]
        return sum(tpots) / len(tpots) if tpots else None

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


class BenchEngine(Protocol):
    """A loaded engine with one decoding method."""

    engine: str  # "verispec", "transformers", ...
    method: str  # PLAIN or a registry name
    k: int  # draft tokens per step (0 for plain)
    reference: ClassVar[str | None]  # engine whose plain greedy ids these must equal (None: none)
    note: ClassVar[str]  # why, where reference is not verispec
    drafts_with_models: ClassVar[bool]  # whether it runs the draft-model methods

    def run(self, prompts: list[list[int]], sampling: Sampling, concurrency: int) -> BatchRun: ...


@dataclass(frozen=True, slots=True)
class TreeShape:
    """A draft tree: topk children per node, depth levels, at most budget nodes of the head's,
    and a prompt-lookup chain of up to `lookup` more nodes grafted on (0: none)."""

    topk: int
    depth: int
    budget: int
    lookup: int = 0

    @property
    def nodes(self) -> int:
        """The node budget the tree is verified with (num_speculative_tokens)."""
        return self.budget + self.lookup

    @property
    def label(self) -> str:
        """As the bench writes it: '4x6:16', or '3x4:8+4' with a lookup of 4 grafted on."""
        lookup = f"+{self.lookup}" if self.lookup else ""
        return f"{self.topk}x{self.depth}:{self.budget}{lookup}"


def parse_tree_shape(text: str) -> TreeShape:
    """'KxD:N' or 'KxD:N+L' -> TreeShape(K, D, N, L), checked: '4x6:16' -> TreeShape(4, 6,
    16), '3x4:8+4' -> TreeShape(3, 4, 8, 4); ValueError for anything else (K >= 2: topk 1 is a
    chain, given by --k)."""
    head, _, nodes = text.strip().partition(":")
    topk, _, depth = head.partition("x")
    budget, plus, lookup = nodes.partition("+")
    try:
        shape = TreeShape(int(topk), int(depth), int(budget), int(lookup) if plus else 0)
    except ValueError:
        raise ValueError(f"tree shape must be KxD:N (topk K, depth D, node budget N) or KxD:N+L "
                         f"(L prompt-lookup nodes grafted on), e.g. 4x6:16 or 3x4:8+4; got "
                         f"{text!r}") from None  # fmt: skip
    if (shape.topk < 2 or shape.depth < 1 or shape.budget < 1 or (plus and shape.lookup < 1)
            or shape.nodes > MAX_TREE_NODES):  # fmt: skip
        raise ValueError(f"tree shape {text!r}: needs topk K >= 2 (K = 1 is a chain: use --k), "
                         f"depth D >= 1, N >= 1, L >= 1 and N + L <= {MAX_TREE_NODES}")  # fmt: skip
    return shape


@dataclass(frozen=True)
class MethodSpec:
    """A decoding method to benchmark: PLAIN, or a registry method with k and its options;
    with a tree, k is its node budget."""

    method: str = PLAIN
    k: int = 0
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    tree: TreeShape | None = None  # head methods only; None = a chain of k

    @property
    def label(self) -> str:
        """k as the table shows it: '4' for a chain, '4x6:16' for a tree."""
        return self.tree.label if self.tree else str(self.k)

    def fitted(self, depth: int | None) -> MethodSpec:
        """The shape a drafter that drafts at most `depth` levels runs (None: no limit):
        a chain of min(k, depth), a tree of min(D, depth) levels."""
        if depth is None:
            return self
        if self.tree is None:
            return replace(self, k=min(self.k, depth))
        return replace(self, tree=replace(self.tree, depth=min(self.tree.depth, depth)))


class VerispecEngine:
    """verispec's LLM with one speculative configuration. draft: the draft checkpoint, or for a
    head method (HEAD_METHODS) its head directory. self.spec is the shape that runs: a drafter
    that drafts fewer levels than asked (Medusa: one per head) runs a shallower chain or tree."""

    engine = "verispec"
    reference: ClassVar[str | None] = "verispec"
    note: ClassVar[str] = ""
    drafts_with_models: ClassVar[bool] = True
    runs_heads: ClassVar[bool] = True  # runs HEAD_METHODS
    runs_own_trees: ClassVar[bool] = True  # runs methods that draft trees of their own (suffix)
    runs_own_layers: ClassVar[bool] = True  # runs self-speculation (the target's own layers)
    quantization: ClassVar[str | None] = None  # of the target's linear weights
    rounds_drafts: ClassVar[bool] = True  # takes draft_quantization (BenchConfig's)

    def __init__(
        self, target: Path, draft: Path | None, spec: MethodSpec, dtype: str, device: str = "cpu",
        draft_quantization: str | None = None, alone: bool = False,
    ) -> None:
        """draft_quantization: a draft model's (SpecConfig.quantization); alone: target is the
        draft, run plainly with that quantization (the draft-alone cost runs)."""
        from verispec import LLM

        self.method, self.k = spec.method, spec.k
        self.llm = LLM(
            model=str(target), dtype=dtype, device=device,
            speculative=spec_config(spec, draft, draft_quantization),
            quantization=draft_quantization if alone else self.quantization,
            enable_prefix_caching=True,
        )  # fmt: skip
        self.spec = spec.fitted(getattr(self.llm.engine.proposer, "depth", None))

    def run(self, prompts: list[list[int]], sampling: Sampling, concurrency: int) -> BatchRun:
        from verispec import SamplingParams

        runs: list[RequestRun] = []
        self.llm.engine.step_times = StepTimes()
        # A drafter that learns from finished outputs (suffix), and the prefix caches, start
        # each pass cold: an earlier pass over the same prompts would otherwise hand them every
        # answer and every prompt. Within a pass, requests share what they share (a system
        # prompt, earlier turns), as a server with prefix caching (vLLM's default) would.
        forget = getattr(self.llm.engine.proposer, "clear_history", None)
        if forget is not None:
            forget()
        self.llm.reset_prefix_cache()
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
        times = self.llm.engine.step_times
        kinds = {kind: list(v) for kind, v in times.kinds.items()}
        return BatchRun(runs, wall, dict(times.seconds), kinds)


class VerispecFp16Engine(VerispecEngine):
    """verispec with the target's linear weights rounded to float16 (the fp16 kernel runs
    them); lossless with respect to those weights, so compared with its own plain decoding."""

    engine = "verispec-fp16"
    reference: ClassVar[str | None] = "verispec-fp16"
    note: ClassVar[str] = "weights rounded to float16: its ids may differ from verispec's"
    quantization: ClassVar[str | None] = "fp16"


class VerispecA8Engine(VerispecEngine):
    """verispec with each product's input rounded to 8-bit blocks of 32 and multiplied by the
    target's 8-bit weight codes (quantization="a8", as llama.cpp computes GGUF models);
    lossless with respect to that computation, so compared with its own plain decoding."""

    engine = "verispec-a8"
    reference: ClassVar[str | None] = "verispec-a8"
    note: ClassVar[str] = "inputs rounded to 8-bit blocks: its ids may differ from verispec's"
    quantization: ClassVar[str | None] = "a8"


def spec_config(
    spec: MethodSpec, draft: Path | None, draft_quantization: str | None = None
) -> SpecConfig | None:
    """The SpecConfig for spec (None for PLAIN); each method is given only the options it
    reads. draft: the draft checkpoint or head directory of methods that take one;
    draft_quantization: a draft model's."""
    if spec.method == PLAIN:
        return None
    options: dict[str, Any] = {}
    traits = method(spec.method)
    if traits.takes_model:
        options["model"] = str(draft)
    if traits.takes_draft_model:
        options["quantization"] = draft_quantization
    if traits.takes_prompt_lookup:
        options["prompt_lookup_min"] = spec.prompt_lookup_min
        options["prompt_lookup_max"] = spec.prompt_lookup_max
    if spec.tree is not None:
        options["tree_topk"], options["tree_depth"] = spec.tree.topk, spec.tree.depth
        if spec.tree.lookup:
            options["prompt_lookup_tokens"] = spec.tree.lookup
    return SpecConfig(method=spec.method, num_speculative_tokens=spec.k, **options)


def gaps(times: list[tuple[float, int]]) -> list[float]:
    """Inter-token gaps from (time, tokens emitted) events, the first event holding the first
    token; tokens of one event share its time: [(1.0, 1), (1.5, 3)] -> [0.5, 0.0, 0.0]."""
    out = [0.0] * (times[0][1] - 1)
    for (before, _), (now, n) in itertools.pairwise(times):
        out += [now - before] + [0.0] * (n - 1)
    return out
