"""Engine: the step loop (schedule, propose, run, verify, update) over a loaded model."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

import torch

from verispec.config import EngineConfig, ResolvedSpec
from verispec.engine.compute_thread import ComputeThread
from verispec.engine.drafter import (
    Capabilities,
    FeatureProposer,
    MakeDrafter,
    Proposer,
    TargetInfo,
)
from verispec.engine.prefill_pace import PrefillPace
from verispec.engine.request import Request, check_prompt
from verispec.engine.runner import ModelRunner
from verispec.engine.scheduler import Schedule, Scheduler
from verispec.engine.step_drafts import StepDrafts, propose_after_forced, trim_to_grammar
from verispec.engine.step_watch import StepWatch
from verispec.kv import BlockAllocator, PrefixCache
from verispec.kv.memory import KVMemory, check_fits, format_size, kv_pool_bytes
from verispec.models.catalog.hub import DEFAULT_MODEL
from verispec.models.paged import PagedModel
from verispec.models.weights.loader import (
    load_model,
    resolve_device,
    resolve_dtype,
    resolve_model_path,
    resolve_quantization,
)
from verispec.sample.grammar import GrammarCompiler
from verispec.sample.rejection import Verdict
from verispec.spec import profiles
from verispec.spec.policy import AdaptiveSpeculation
from verispec.tokenizer import Tokenizer
from verispec.types.outputs import RequestOutput, TokenLogprobs
from verispec.types.sampling_params import SamplingParams
from verispec.types.stats import SpecStats, StepTimes

R = TypeVar("R")

PACE_RUNS = 2
"""Timed one-token forwards at start whose fastest seeds the prefill pace's plain step."""


class Engine:
    """Continuous-batching generation over a paged KV cache."""

    def __init__(
        self, config: EngineConfig, make_drafter: MakeDrafter | None = None,
        progress: bool = False,
    ) -> None:  # fmt: skip
        """Load the model and tokenizer, size the KV cache, then set up speculation (the drafter
        make_drafter builds for config.speculative, a ResolvedSpec the API layer made; prefix
        caching; adaptive policy) and the scheduler over them. self.config holds the SpecConfig
        that runs."""
        self._compute = ComputeThread()  # every kernel call in one thread: compute_thread.py
        self._compute.bind(self)
        self._compute.run(self._build, config, make_drafter, progress)

    def _build(self, config: EngineConfig, make_drafter: MakeDrafter | None,
               progress: bool) -> None:  # fmt: skip
        resolved = config.speculative
        if resolved is not None and not isinstance(resolved, ResolvedSpec):
            raise ValueError(f"the engine takes a resolved speculative config (a ResolvedSpec) "
                             f"or None, got {resolved!r}: resolve it first "
                             f"(spec/resolve.py)")  # fmt: skip
        if (resolved is None) != (make_drafter is None):
            raise ValueError("an engine with a speculative config needs its drafter's builder "
                             "(make_drafter), and one without needs none")  # fmt: skip
        self.device = resolve_device(config.device)
        self.model_path = resolve_model_path(config.model or DEFAULT_MODEL)
        dtype = resolve_dtype(config.dtype, self.device)
        quantization = resolve_quantization(config.quantization, self.model_path, self.device,
                                            dtype, config.linear_backend, config.compile)
        spec = None if resolved is None else resolved.spec  # the SpecConfig that runs
        self.config = config = replace(config, quantization=quantization, speculative=spec)
        self.model = load_model(
            self.model_path, dtype, self.device, config.linear_backend, progress,
            batch_invariant=config.batch_invariant, quantization=config.quantization,
            compile=config.compile,
        )  # fmt: skip
        self.tokenizer = Tokenizer(self.model_path)
        self.max_model_len = self._max_model_len()
        num_blocks = self._num_blocks()
        generator = torch.Generator(self.device).manual_seed(config.seed)
        self._grammars: GrammarCompiler | None = None  # built by the first constrained request
        self.runner = ModelRunner(
            PagedModel(self.model, num_blocks, config.cache.block_size), generator
        )
        self.eos_token_ids = frozenset(
            self.tokenizer.eos_token_ids + self.model.config.eos_token_ids
        )
        self.proposer = self._make_proposer(make_drafter, dtype, num_blocks, generator)
        self.capabilities = Capabilities.of(self.proposer)
        """The proposer's optional capabilities (engine/drafter.py), found and checked once."""
        self.kv_memory = self._kv_memory()
        """The bytes of the KV pools, committed now (kv/memory.py): what they take under load."""
        self.prefix_cache = self._prefix_caching()
        """The index of computed KV blocks, when config.enable_prefix_caching (docs/design.md,
        5), else None."""
        self.spec_policy = self._make_policy()
        """Chooses each step's draft counts when spec.adaptive (spec/policy.py), else None."""
        self.scheduler = Scheduler(
            config.max_num_seqs, config.max_num_batched_tokens,
            spec.num_speculative_tokens if spec else 0, self.prefix_cache, self.spec_policy,
            self.capabilities.shared_prefix if self.prefix_cache is not None else None,
            config.long_prefill_chunk, self._prefill_pace(),
        )  # fmt: skip
        self.spec_stats = SpecStats()
        """Acceptance counters summed over every request this engine has served."""
        self.watch = StepWatch(StepTimes(), self.scheduler.pace, self.spec_policy)
        """The observer of each step's times (engine/step_watch.py)."""
        self.num_preemptions = 0
        """Requests whose KV was freed to make room for others (recomputed later), summed."""
        self._ids = itertools.count()

    @property
    def step_times(self) -> StepTimes:
        """Seconds spent per step phase (schedule, draft, target, verify, update), summed."""
        return self.watch.times

    @step_times.setter
    def step_times(self, times: StepTimes) -> None:
        self.watch.times = times

    @property
    def clock(self) -> Callable[[], float]:
        """Seconds, read around each step for the prefill pace and the adaptive policy (a
        test gives its own to simulate a slower machine)."""
        return self.watch.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self.watch.clock = clock

    def _max_model_len(self) -> int:
        """config.max_model_len, or the model's own limit when unset; above that limit: an
        error."""
        model_len = self.model.config.max_position_embeddings
        asked = self.config.max_model_len
        if asked is not None and asked > model_len:
            raise ValueError(
                f"max_model_len={asked} is above what the model supports "
                f"(max_position_embeddings={model_len} in its config); give at most {model_len}"
            )
        return asked or model_len

    def _num_blocks(self) -> int:
        """KV blocks of the target's cache: config.cache.num_blocks, or as many as its memory
        budget holds (kv/memory.py, kv_pool_bytes); fewer than one sequence of max_model_len
        needs, or more than the device has available: an error naming what to change."""
        cache, c = self.config.cache, self.config
        block_bytes = self.model.kv_token_bytes * cache.block_size
        blocks_per_seq = math.ceil(self.max_model_len / cache.block_size)
        if cache.num_blocks is not None:
            num_blocks = cache.num_blocks
            given = f"num_blocks={num_blocks} (blocks of {cache.block_size} tokens)"
        else:
            pool = kv_pool_bytes(cache.kv_cache_memory, block_bytes, blocks_per_seq,
                                 c.max_num_seqs, self.device)  # fmt: skip
            num_blocks = pool // block_bytes
            given = (f"kv_cache_memory={pool} ({format_size(pool)}: {num_blocks} blocks of "
                     f"{cache.block_size} tokens)")  # fmt: skip
        if num_blocks < blocks_per_seq:
            raise ValueError(
                f"{given} cannot hold one sequence of max_model_len={self.max_model_len}: that "
                f"needs {blocks_per_seq} blocks ({format_size(blocks_per_seq * block_bytes)}); "
                f"give at least that, or a smaller max_model_len"
            )
        check_fits(num_blocks * block_bytes, self.device,
                   "give a smaller kv_cache_memory (verispec serve --kv-cache-memory), "
                   "max_model_len or max_num_seqs")  # fmt: skip
        return num_blocks

    def _kv_memory(self) -> KVMemory:
        """The KV pools this engine committed: the target's and a drafter's own."""
        target = self.runner.target
        own = self.capabilities.own_kv
        drafter = own.kv_cache.nbytes if own is not None else 0
        return KVMemory(target.kv.nbytes, drafter, target.kv.num_blocks * target.block_size,
                        self.max_model_len)  # fmt: skip

    def _make_proposer(
        self, make_drafter: MakeDrafter | None, dtype: torch.dtype, num_blocks: int,
        generator: torch.Generator,
    ) -> Proposer | None:  # fmt: skip
        """The drafter make_drafter builds (None without speculation), told what it needs of
        the target."""
        c = self.config
        if make_drafter is None:
            return None
        target = TargetInfo(
            tokenizer=self.tokenizer, vocab_size=self.model.config.vocab_size,
            device=self.device, dtype=dtype, max_model_len=self.max_model_len,
            num_blocks=num_blocks, generator=generator, block_size=c.cache.block_size,
            max_num_seqs=c.max_num_seqs, linear_backend=c.linear_backend,
            batch_invariant=c.batch_invariant, compile=c.compile, model=self.model,
        )  # fmt: skip
        return make_drafter(target)

    def _prefix_caching(self) -> PrefixCache | None:
        """The index of computed KV blocks, when config.enable_prefix_caching (docs/design.md,
        5), else None; a drafter with a KV cache of its own indexes its blocks too (and one
        that reads every position, EAGLE, has the scheduler cut a hit to what both hold)."""
        if not self.config.enable_prefix_caching:
            return None
        if self.capabilities.prefixes is not None:  # a draft model, an EAGLE head
            self.capabilities.prefixes.enable_prefix_caching()
        return PrefixCache(self.allocator, self.config.cache.block_size)

    def _prefill_pace(self) -> PrefillPace | None:
        """The pace of long prefills (engine/prefill_pace.py), its plain step seeded with a
        one-token forward timed now on this machine; None without long prefills."""
        if self.config.long_prefill_chunk is None:
            return None
        return PrefillPace(plain_step=self.runner.target.time_forward(1, runs=PACE_RUNS))

    def _make_policy(self) -> AdaptiveSpeculation | None:
        """The adaptive policy that chooses each step's draft counts when spec.adaptive (a
        tree's node budget as a chain's depth: spec/policy.py), its costs seeded by the
        start-up profile of target steps (spec/profiles.py); else None."""
        spec = self.config.speculative
        if spec is None or not spec.adaptive:
            return None
        facts = profiles.facts(self.config, self.model_path, self.model.dtype, self.device,
                               self.max_model_len)  # fmt: skip
        cost = profiles.target_cost(self.runner.target, facts)
        return AdaptiveSpeculation(spec.num_speculative_tokens, cost)

    def add_request(
        self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None
    ) -> Request:
        """Validate and queue one prompt (text or token ids)."""
        text, ids = (
            (prompt, self.tokenizer.encode(prompt)) if isinstance(prompt, str) else (None, prompt)
        )
        check_prompt(ids, self.model.config.vocab_size, self.max_model_len)
        grammar = None
        if params.structured_outputs is not None:
            grammar = self.grammars.matcher(params.structured_outputs)
        request = Request(
            request_id=request_id or str(next(self._ids)),
            prompt=text,
            prompt_token_ids=list(ids),
            params=params,
            block_table=self.runner.target.new_table(),
            eos_token_ids=self.eos_token_ids,
            max_model_len=self.max_model_len,
            grammar=grammar,
        )
        self.scheduler.add(request)
        return request

    @property
    def grammars(self) -> GrammarCompiler:
        """The tokenizer as the structured-output library sees it, built on first use."""
        if self._grammars is None:
            self._grammars = GrammarCompiler(self.tokenizer.hf, self.model.config.vocab_size,
                                             self.eos_token_ids)  # fmt: skip
        return self._grammars

    @property
    def allocator(self) -> BlockAllocator:
        """The target's KV block allocator."""
        return self.runner.target.allocator

    def step(self) -> list[Request]:
        """Schedule, propose, run the target, verify, update (docs/design.md, 1); returns the
        requests that received tokens this step. Each phase's time goes to self.watch."""
        return self._compute.run(self._step)

    def compute(self, fn: Callable[[], R]) -> R:
        """fn() in the thread this engine computes in (a loop of steps pays no hand-off)."""
        return self._compute.run(fn)

    def _step(self) -> list[Request]:
        watch = self.watch.start()
        plan = watch.timed("schedule", self._schedule)
        drafts = watch.timed("draft", self._propose, plan)
        logits, features = watch.timed("target", self.runner.execute, plan.scheduled, drafts,
                                       self._feature_layers)  # fmt: skip
        verdict, logprobs = watch.timed("verify", self._verify, plan, drafts, logits, features)
        watch.timed("update", self._update, plan, drafts, verdict, logprobs)
        watch.end(plan, drafts, verdict)
        return [s.request for s in plan.sampling]

    def _schedule(self) -> Schedule:
        """The step's plan; the drafter forgets the requests it preempted."""
        plan = self.scheduler.schedule()
        if not plan.scheduled:
            raise RuntimeError("scheduler found no runnable request although some are unfinished")
        self._release(plan.preempted)
        self.num_preemptions += len(plan.preempted)
        return plan

    def _propose(self, plan: Schedule) -> StepDrafts:
        """The drafts of each decoding request with draft slots, as the step's value: the
        tokens its grammar forces (free, q one-hot), then the drafter's after them (step_drafts.
        propose_after_forced), chains trimmed to the grammar; none without a proposer."""
        drafting = [i for i, s in enumerate(plan.scheduled) if s.num_draft_slots > 0]
        if self.proposer is None or not drafting:
            return StepDrafts.none(len(plan.scheduled))
        chunks = [plan.scheduled[i] for i in drafting]
        requests, forced = [s.request for s in chunks], [s.forced for s in chunks]
        drafts = propose_after_forced(self.proposer, self.capabilities.continues_forced is not None,
                                      requests, forced, [s.num_draft_slots for s in chunks])
        return StepDrafts.placed(len(plan.scheduled), drafting, drafts,
                                 trim_to_grammar(requests, drafts), [len(f) for f in forced])

    def _verify(
        self, plan: Schedule, drafts: StepDrafts, logits: torch.Tensor,
        features: torch.Tensor | None,
    ) -> tuple[Verdict, list[list[TokenLogprobs] | None] | None]:  # fmt: skip
        """The verdict on the step's drafts; a feature drafter observes the kept positions, and
        the requests that ask get their tokens' logprobs (else None)."""
        verdict = self.runner.verify(logits, plan, drafts)
        if self.capabilities.features is not None and features is not None:
            self._observe(self.capabilities.features, plan, drafts, verdict, features)
        logprobs = None
        if any(s.request.params.logprobs is not None for s in plan.sampling):
            logprobs = self.runner.logprobs(logits, plan, drafts, verdict)
        return verdict, logprobs

    def _update(
        self, plan: Schedule, drafts: StepDrafts, verdict: Verdict,
        logprobs: list[list[TokenLogprobs] | None] | None,
    ) -> None:  # fmt: skip
        """Apply the verdict to the requests and the KV; release the finished ones."""
        finished = self.scheduler.update(
            plan, drafts, verdict, self.tokenizer.decode, self.spec_stats, logprobs
        )
        self._release(finished)

    @property
    def _feature_layers(self) -> tuple[int, ...]:
        """The target layers whose features the drafter reads (none for most drafters)."""
        drafter = self.capabilities.features
        return drafter.feature_layers if drafter is not None else ()

    @staticmethod
    def _observe(
        proposer: FeatureProposer, plan: Schedule, drafts: StepDrafts, verdict: Verdict,
        features: torch.Tensor,
    ) -> None:  # fmt: skip
        """Hand a feature drafter the features [new tokens, F] of the positions whose KV is
        kept: each chunk's tokens, then the accepted drafts (a tree's accepted path)."""
        sampled = {i: row for row, i in enumerate(plan.sampled)}  # verdict row of each chunk
        offset = 0
        for i, (s, ids) in enumerate(zip(plan.scheduled, drafts.token_ids, strict=True)):
            rows = list(range(offset, offset + len(s.token_ids)))
            if i in sampled:
                first = offset + len(s.token_ids)
                rows += [first + d for d in verdict.accepted_drafts(sampled[i])]
            proposer.observe(s.request, s.start, features[rows])
            offset += len(s.token_ids) + len(ids)

    def _release(self, requests: list[Request]) -> None:
        """Drop what the drafter (and the adaptive policy) holds for requests that finished or
        lost their KV."""
        if self.proposer is not None:
            for request in requests:
                self.proposer.release(request)
        if self.spec_policy is not None:
            for request in requests:
                if request.finished:
                    self.spec_policy.release(request.request_id)

    def abort_request(self, request: Request) -> None:
        """Stop a request before it finishes; it keeps the tokens it has, and frees its blocks."""
        self.scheduler.abort(request)
        self._release([request])

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def reset_prefix_cache(self) -> bool:
        """Empty the prefix caches, the target's and a drafter's own (e.g. between benchmark
        passes over the same prompts). Only between requests: False, and nothing is emptied,
        while some are unfinished; True otherwise (also without prefix caching)."""
        if self.has_unfinished():
            return False
        own = self.capabilities.prefixes
        for cache in (self.prefix_cache, own.prefix_cache if own is not None else None):
            if cache is not None:
                cache.reset()
        return True

    def output(self, request: Request) -> RequestOutput:
        return request.output(self.tokenizer.decode)
