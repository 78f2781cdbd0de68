"""Engine: the step loop (schedule, run, sample, update) over a loaded model and tokenizer."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import replace

import torch

from verispec.api.outputs import RequestOutput
from verispec.api.sampling_params import SamplingParams
from verispec.config import EngineConfig
from verispec.drafters.proposer import FeatureProposer, Proposer, TargetInfo
from verispec.drafters.registry import make_proposer
from verispec.engine import profiles
from verispec.engine.request import Request
from verispec.engine.runner import ModelRunner
from verispec.engine.scheduler import Schedule, ScheduledRequest, Scheduler, step_kind
from verispec.engine.spec_policy import AdaptiveSpeculation, StepCost
from verispec.engine.stats import SpecStats, StepTimes
from verispec.kv import BlockAllocator, CachesPrefixes, DrafterPrefix, PrefixCache
from verispec.models.catalog.hub import DEFAULT_MODEL
from verispec.models.kernels.linear import cpu_model
from verispec.models.paged import PagedModel, append_chunk
from verispec.models.weights.loader import (
    load_model,
    resolve_device,
    resolve_dtype,
    resolve_model_path,
)
from verispec.sample.rejection import Verdict
from verispec.spec.resolve import DraftRuntime, resolve_speculative
from verispec.tokenizer import Tokenizer

PROFILE_TOKENS = 16
"""The largest target step timed at start-up (engine._profile_target)."""
PROFILE_RUNS = 3
"""Timed forwards per token count at start-up; the fastest counts (other work on the machine
only ever adds time, and one slowed run made drafts look dear for the whole first window)."""


class Engine:
    """Continuous-batching generation over a paged KV cache."""

    def __init__(self, config: EngineConfig, progress: bool = False) -> None:
        spec = resolve_speculative(config.model, config.speculative,
                                   runtime=DraftRuntime.of(config))  # fmt: skip
        self.config = config = replace(config, speculative=spec)
        self.device = resolve_device(config.device)
        self.model_path = resolve_model_path(config.model or DEFAULT_MODEL)
        dtype = resolve_dtype(config.dtype, self.device)
        self.model = load_model(
            self.model_path, dtype, self.device, config.linear_backend, progress,
            batch_invariant=config.batch_invariant, quantization=config.quantization,
            compile=config.compile,
        )  # fmt: skip
        self.tokenizer = Tokenizer(self.model_path)
        model_len = self.model.config.max_position_embeddings
        if config.max_model_len is not None and config.max_model_len > model_len:
            raise ValueError(
                f"max_model_len={config.max_model_len} is above what the model supports "
                f"(max_position_embeddings={model_len} in its config); give at most {model_len}"
            )
        self.max_model_len = config.max_model_len or model_len
        block_size = config.cache.block_size
        blocks_per_seq = math.ceil(self.max_model_len / block_size)
        num_blocks = config.cache.num_blocks or config.max_num_seqs * blocks_per_seq
        if num_blocks < blocks_per_seq:
            raise ValueError(
                f"num_blocks={num_blocks} of {block_size} tokens cannot hold one sequence of "
                f"max_model_len={self.max_model_len}; need at least {blocks_per_seq}"
            )
        generator = torch.Generator(self.device).manual_seed(config.seed)
        self.runner = ModelRunner(PagedModel(self.model, num_blocks, block_size), generator)
        spec = config.speculative
        self.eos_token_ids = frozenset(
            self.tokenizer.eos_token_ids + self.model.config.eos_token_ids
        )
        self.proposer: Proposer | None = None
        if spec is not None:
            target = TargetInfo(
                tokenizer=self.tokenizer, vocab_size=self.model.config.vocab_size,
                device=self.device, dtype=dtype, max_model_len=self.max_model_len,
                num_blocks=num_blocks, generator=generator, block_size=block_size,
                max_num_seqs=config.max_num_seqs, linear_backend=config.linear_backend,
                batch_invariant=config.batch_invariant, compile=config.compile, model=self.model,
            )  # fmt: skip
            self.proposer = make_proposer(spec, target)
        self.feature_drafter = (
            self.proposer if isinstance(self.proposer, FeatureProposer) else None
        )
        """The proposer when it reads the target's features (EAGLE, Medusa), else None."""
        self.prefix_cache: PrefixCache | None = None
        """The index of computed KV blocks, when config.enable_prefix_caching (docs/design.md,
        5); a drafter with a KV cache of its own indexes its blocks too, and one that reads the
        target's features of every position (EAGLE) cuts a hit to what both hold."""
        drafter_prefix = None
        if config.enable_prefix_caching:
            self.prefix_cache = PrefixCache(self.allocator, block_size)
            if isinstance(self.proposer, CachesPrefixes):  # a draft model, an EAGLE head
                self.proposer.enable_prefix_caching()
            drafter = self.feature_drafter
            if drafter is not None and drafter.reads_every_position:
                if not isinstance(drafter, DrafterPrefix):
                    raise TypeError(f"{type(drafter).__name__} reads every position but keeps "
                                    "no prefix cache (kv.prefix_cache.DrafterPrefix)")  # fmt: skip
                drafter_prefix = drafter
        self.spec_policy: AdaptiveSpeculation | None = None
        """Chooses each step's draft counts when spec.adaptive (engine/spec_policy.py)."""
        if spec is not None and spec.adaptive:
            # A tree's node budget is chosen as a chain's depth is (engine/spec_policy.py).
            self.spec_policy = AdaptiveSpeculation(spec.num_speculative_tokens,
                                                   self._profile_target())  # fmt: skip
        self.scheduler = Scheduler(
            config.max_num_seqs, config.max_num_batched_tokens,
            spec.num_speculative_tokens if spec else 0, self.prefix_cache, self.spec_policy,
            drafter_prefix,
        )  # fmt: skip
        self.spec_stats = SpecStats()
        """Acceptance counters summed over every request this engine has served."""
        self.step_times = StepTimes()
        """Seconds spent per step phase (schedule, draft, target, verify, update), summed."""
        self.num_preemptions = 0
        """Requests whose KV was freed to make room for others (recomputed later), summed."""
        self._ids = itertools.count()

    def add_request(
        self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None
    ) -> Request:
        """Validate and queue one prompt (text or token ids)."""
        text, ids = (
            (prompt, self.tokenizer.encode(prompt)) if isinstance(prompt, str) else (None, prompt)
        )
        self._check_prompt(ids)
        generator = None
        if params.seed is not None:
            generator = torch.Generator(self.device).manual_seed(params.seed)
        request = Request(
            request_id=request_id or str(next(self._ids)),
            prompt=text,
            prompt_token_ids=list(ids),
            params=params,
            block_table=self.runner.target.new_table(),
            generator=generator,
            eos_token_ids=self.eos_token_ids,
            max_model_len=self.max_model_len,
        )
        self.scheduler.add(request)
        return request

    @property
    def allocator(self) -> BlockAllocator:
        """The target's KV block allocator."""
        return self.runner.target.allocator

    def _profile_target(self) -> StepCost:
        """Time target forwards of 1, 2, 4, 8 and 16 new tokens (the adaptive policy's first
        cost model; each the fastest of PROFILE_RUNS timed runs after an untimed one). Larger
        steps are extrapolated from the last segment (spec_policy._interpolate), which is linear
        there, and learned online: timing up to 64 tokens made loading a 1.5B model several
        seconds longer (docs/design.md, 10).
        A profile is kept in the cache per model file, settings, threads, CPU and kernel, so a
        later load of the same model on the same machine skips the forwards."""
        facts = self._profile_facts()
        known = profiles.load(facts)
        if known is not None:
            return StepCost(profile=known)
        cost = StepCost()
        target = self.runner.target
        for tokens in (t for t in (1, 2, 4, 8, 16) if t <= int(facts["limit"])):
            table = target.new_table()
            try:
                chunk = append_chunk(table, [0] * tokens)
                target.forward([chunk])
                runs = []
                for _ in range(PROFILE_RUNS):
                    start = time.perf_counter()
                    target.forward([chunk])
                    runs.append(time.perf_counter() - start)
                cost.profile[tokens] = min(runs)
            finally:
                table.free()
        profiles.store(facts, cost.profile)
        return cost

    def _profile_facts(self) -> dict[str, object]:
        """What a target step's cost depends on: the model's files, the settings that change its
        kernels, the step limit, threads, CPU model, torch and the native library built."""
        c = self.config
        return {
            "model": profiles.files_key(self.model_path), "dtype": str(self.model.dtype),
            "device": str(self.device), "linear_backend": c.linear_backend,
            "quantization": c.quantization, "batch_invariant": c.batch_invariant,
            "compile": c.compile, "limit": min(c.max_num_batched_tokens, self.max_model_len - 1,
                                               PROFILE_TOKENS),
            "threads": torch.get_num_threads(), "cpu": cpu_model(), "torch": torch.__version__,
            "kernel": profiles.kernel_key(),
        }  # fmt: skip

    def step(self) -> list[Request]:
        """Schedule, draft, run one target forward, verify, update; returns the requests that
        received tokens this step."""
        clock = self.step_times
        clock.start()
        started = time.perf_counter()
        plan = self.scheduler.schedule()
        if not plan.scheduled:
            raise RuntimeError("scheduler found no runnable request although some are unfinished")
        self._release(plan.preempted)
        self.num_preemptions += len(plan.preempted)
        clock.lap("schedule")
        drafting_started = time.perf_counter()
        draft_probs = self._propose(plan.scheduled)
        draft_s = time.perf_counter() - drafting_started
        clock.lap("draft")
        drafter = self.feature_drafter
        layers = drafter.feature_layers if drafter is not None else ()
        logits, features = self.runner.execute(plan.scheduled, layers)
        clock.lap("target")
        clock.record(step_kind(plan.scheduled), time.perf_counter() - drafting_started)
        verdict = self.runner.verify(logits, plan.sampling, draft_probs)
        if drafter is not None and features is not None:
            self._observe(drafter, plan, verdict, features)
        logprobs = None
        if any(s.request.params.logprobs is not None for s in plan.sampling):
            logprobs = self.runner.logprobs(logits, plan.sampling, verdict)
        clock.lap("verify")
        finished = self.scheduler.update(
            plan, verdict, self.tokenizer.decode, self.spec_stats, logprobs
        )
        self._release(finished)
        clock.lap("update")
        clock.steps += 1
        if self.spec_policy is not None:
            self._observe_step(self.spec_policy, plan, verdict,
                               time.perf_counter() - started, draft_s)  # fmt: skip
        return [s.request for s in plan.sampling]

    @staticmethod
    def _observe_step(
        policy: AdaptiveSpeculation, plan: Schedule, verdict: Verdict, step_s: float,
        draft_s: float,
    ) -> None:  # fmt: skip
        """Feed the adaptive policy this step's times and each request's acceptance."""
        tokens = sum(len(s.token_ids) + len(s.draft_token_ids) for s in plan.scheduled)
        depth = max((len(s.draft_token_ids) for s in plan.scheduled), default=0)
        # Prefill tokens cost less than verify rows (shorter attention): only steps of decode
        # rows and their drafts teach the target curve, which the policy asks about them.
        decode_only = all(len(s.token_ids) == 1 and s.start > 0 for s in plan.scheduled)
        policy.cost.observe(tokens if decode_only else None, depth, step_s - draft_s, draft_s)
        for s, accepted in zip(plan.sampling, verdict.num_accepted, strict=True):
            policy.observe_request(s.request.request_id, len(s.draft_token_ids), accepted)

    def _propose(self, scheduled: list[ScheduledRequest]) -> torch.Tensor | None:
        """Fill each decoding request's draft tokens; return the drafter's q rows (or None)."""
        drafting = [s for s in scheduled if s.num_draft_slots > 0]
        if self.proposer is None or not drafting:
            return None
        drafts = self.proposer.propose(
            [s.request for s in drafting], [s.num_draft_slots for s in drafting]
        )
        for i, (s, ids) in enumerate(zip(drafting, drafts.token_ids, strict=True)):
            s.draft_token_ids = ids
            s.draft_tree = None if drafts.trees is None else drafts.trees[i]
        return drafts.probs

    @staticmethod
    def _observe(
        proposer: FeatureProposer, plan: Schedule, verdict: Verdict, features: torch.Tensor
    ) -> None:
        """Hand a feature drafter the features [new tokens, F] of the positions whose KV is
        kept: each chunk's tokens, then the accepted drafts (a tree's accepted path)."""
        sampled = {id(s): i for i, s in enumerate(plan.sampling)}  # verdict row of each
        offset = 0
        for s in plan.scheduled:
            rows = list(range(offset, offset + len(s.token_ids)))
            if id(s) in sampled:
                first = offset + len(s.token_ids)
                rows += [first + d for d in verdict.accepted_drafts(sampled[id(s)])]
            proposer.observe(s.request, s.start, features[rows])
            offset += len(s.token_ids) + len(s.draft_token_ids)

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
        for cache in (self.prefix_cache, getattr(self.proposer, "prefix_cache", None)):
            if cache is not None:
                cache.reset()
        return True

    def output(self, request: Request) -> RequestOutput:
        return request.output(self.tokenizer.decode)

    def _check_prompt(self, ids: list[int]) -> None:
        if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids
        ):
            raise ValueError("a prompt must be a string or a list of integer token ids")
        if not ids:
            raise ValueError("the prompt is empty; give at least one token")
        vocab = self.model.config.vocab_size
        bad = next((i for i in ids if not 0 <= i < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {vocab})")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(ids)} tokens but max_model_len is {self.max_model_len}; "
                f"at most {self.max_model_len - 1} prompt tokens leave room for one output token"
            )
