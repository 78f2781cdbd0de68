"""Engine: the step loop (schedule, run, sample, update) over a loaded model and tokenizer."""

from __future__ import annotations

import itertools
import math

import torch

from verispec.config import EngineConfig
from verispec.drafters.proposer import Proposer, TargetInfo
from verispec.drafters.registry import make_proposer
from verispec.engine.runner import ModelRunner
from verispec.engine.scheduler import ScheduledRequest, Scheduler
from verispec.kv import BlockAllocator, BlockTable
from verispec.metrics import SpecStats, StepTimes
from verispec.models.default import default_model_path
from verispec.models.loader import load_model, resolve_dtype, resolve_model_path
from verispec.outputs import RequestOutput
from verispec.request import Request
from verispec.sampling_params import SamplingParams
from verispec.tokenizer import Tokenizer


def resolve_device(device: str) -> torch.device:
    """ "auto" = the first CUDA device when there is one, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N; got {device!r}") from e
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but no CUDA device is available")
    return resolved


class Engine:
    """Continuous-batching generation over a paged KV cache."""

    def __init__(self, config: EngineConfig, progress: bool = False) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        self.model_path = resolve_model_path(config.model or default_model_path())
        dtype = resolve_dtype(config.dtype, self.device)
        self.model = load_model(
            self.model_path, dtype, self.device, config.linear_backend, progress,
            batch_invariant=config.batch_invariant, quantization=config.quantization,
        )  # fmt: skip
        self.tokenizer = Tokenizer(self.model_path)
        model_len = self.model.config.max_position_embeddings
        self.max_model_len = min(config.max_model_len or model_len, model_len)
        block_size = config.cache.block_size
        blocks_per_seq = math.ceil(self.max_model_len / block_size)
        num_blocks = config.cache.num_blocks or config.max_num_seqs * blocks_per_seq
        if num_blocks < blocks_per_seq:
            raise ValueError(
                f"num_blocks={num_blocks} of {block_size} tokens cannot hold one sequence of "
                f"max_model_len={self.max_model_len}; need at least {blocks_per_seq}"
            )
        self.allocator = BlockAllocator(num_blocks)
        generator = torch.Generator(self.device).manual_seed(config.seed)
        self.runner = ModelRunner(
            self.model, self.model.new_kv_cache(num_blocks, block_size), generator
        )
        spec = config.speculative
        self.scheduler = Scheduler(
            config.max_num_seqs,
            config.max_num_batched_tokens,
            spec.num_speculative_tokens if spec else 0,
        )
        self.eos_token_ids = frozenset(
            self.tokenizer.eos_token_ids + self.model.config.eos_token_ids
        )
        self.proposer: Proposer | None = None
        if spec is not None:
            target = TargetInfo(
                tokenizer=self.tokenizer, vocab_size=self.model.config.vocab_size,
                device=self.device, dtype=dtype, max_model_len=self.max_model_len,
                num_blocks=num_blocks, generator=generator,
            )  # fmt: skip
            self.proposer = make_proposer(spec, config, target)
        self.spec_stats = SpecStats()
        """Acceptance counters summed over every request this engine has served."""
        self.step_times = StepTimes()
        """Seconds spent per step phase (schedule, draft, target, verify, update), summed."""
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
            block_table=BlockTable(self.allocator, self.config.cache.block_size),
            generator=generator,
            eos_token_ids=self.eos_token_ids,
            max_model_len=self.max_model_len,
        )
        self.scheduler.add(request)
        return request

    def step(self) -> list[Request]:
        """Schedule, draft, run one target forward, verify, update; returns the requests that
        received tokens this step."""
        clock = self.step_times
        clock.start()
        scheduled = self.scheduler.schedule()
        if not scheduled:
            raise RuntimeError("scheduler found no runnable request although some are unfinished")
        clock.lap("schedule")
        draft_probs = self._propose(scheduled)
        clock.lap("draft")
        logits = self.runner.execute(scheduled)  # [rows of sampling requests, vocab]
        clock.lap("target")
        sampling = [s for s in scheduled if s.samples]
        verdict = self.runner.verify(logits, sampling, draft_probs)
        clock.lap("verify")
        for s in scheduled:
            s.request.num_computed_tokens += len(s.token_ids)
        for s, tokens, accepted in zip(
            sampling, verdict.token_ids, verdict.num_accepted, strict=True
        ):
            self._update(s, tokens, accepted)
        clock.lap("update")
        self.step_times.steps += 1
        return [s.request for s in sampling]

    def _propose(self, scheduled: list[ScheduledRequest]) -> torch.Tensor | None:
        """Fill each decoding request's draft tokens; return the drafter's q rows (or None)."""
        if self.proposer is None:
            self.scheduler.preempted.clear()  # nothing to release; do not keep them alive
            return None
        for request in self.scheduler.preempted:
            self.proposer.release(request)
        self.scheduler.preempted.clear()
        drafting = [s for s in scheduled if s.num_draft_slots > 0]
        if not drafting:
            return None
        drafts = self.proposer.propose(
            [s.request for s in drafting], [s.num_draft_slots for s in drafting]
        )
        for s, ids in zip(drafting, drafts.token_ids, strict=True):
            s.draft_token_ids = ids
        return drafts.probs

    def _update(self, s: ScheduledRequest, tokens: list[int], accepted: int) -> None:
        """Keep the accepted drafts' KV, drop the rest, append the emitted tokens, count."""
        request = s.request
        request.num_computed_tokens += accepted
        request.block_table.truncate(request.num_computed_tokens)
        request.spec_stats.record(len(s.draft_token_ids), accepted)
        self.spec_stats.record(len(s.draft_token_ids), accepted)
        request.append_tokens(tokens, self.tokenizer.decode)
        if request.finished:
            self.scheduler.finish(request)
            if self.proposer is not None:
                self.proposer.release(request)

    def abort_request(self, request: Request) -> None:
        """Stop a request before it finishes; it keeps the tokens it has, and frees its blocks."""
        self.scheduler.abort(request)
        if self.proposer is not None:
            self.proposer.release(request)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

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
