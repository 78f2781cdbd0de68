"""Request: one prompt's state as it moves through the engine (tokens, KV blocks, timings)."""

from __future__ import annotations

import copy
import enum
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from verispec.kv import BlockTable
from verispec.sample import SamplingTensors
from verispec.sample.grammar import GrammarMatcher
from verispec.sample.noise import NoiseKey
from verispec.types.outputs import FinishReason, RequestMetrics, RequestOutput, TokenLogprobs
from verispec.types.sampling_params import SamplingParams
from verispec.types.stats import SpecStats


class TokenHistory(Protocol):
    """What a drafter reads of a request (engine/drafter.py) and the warping helpers below
    read: its id, its tokens so far, and how it samples (params, grammar). A Request is one; a
    drafter replayed on recorded outputs is handed another."""

    @property
    def request_id(self) -> str: ...
    @property
    def prompt_token_ids(self) -> list[int]: ...
    @property
    def output_token_ids(self) -> list[int]: ...
    @property
    def all_token_ids(self) -> list[int]: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def params(self) -> SamplingParams: ...
    @property
    def grammar(self) -> GrammarMatcher | None: ...
    @property
    def finished(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class AfterForced:
    """A request's history with its grammar-forced drafts appended, as a drafter that drafts on
    after them reads it (engine/drafter.py, ContinuesForced): the forced tokens count as output,
    the grammar is read after them, and num_verified says where the target's tokens end.

    Worked example: output [5, 6] and forced [7, 8] -> output_token_ids [5, 6, 7, 8], the next
    draft's noise key is output position 4, and num_verified is the prompt's length + 2.
    """

    request: TokenHistory
    forced: list[int]

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.request.prompt_token_ids

    @property
    def output_token_ids(self) -> list[int]:
        return self.request.output_token_ids + self.forced

    @property
    def all_token_ids(self) -> list[int]:
        return self.request.all_token_ids + self.forced

    @property
    def num_tokens(self) -> int:
        return self.request.num_tokens + len(self.forced)

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def grammar(self) -> GrammarMatcher | None:
        g = self.request.grammar
        return None if g is None else g.after(self.forced)

    @property
    def finished(self) -> bool:
        return self.request.finished

    @property
    def num_verified(self) -> int:
        """Tokens of the history the target has seen: all but the forced drafts."""
        return self.request.num_tokens


def num_verified(history: TokenHistory) -> int:
    """Tokens of a history the target has verified: all of a request's, all but the forced
    drafts of an AfterForced (what a drafter may index in a prefix cache)."""
    return history.num_verified if isinstance(history, AfterForced) else history.num_tokens


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Request:
    """A request's tokens and progress; the scheduler moves it, the engine appends tokens.

    Compared by identity (eq=False): the scheduler's `in`/`remove` on its queues would otherwise
    compare every field of every queued request, quadratic in the batch size.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    block_table: BlockTable
    eos_token_ids: frozenset[int]
    max_model_len: int
    arrival_time: float = field(default_factory=time.perf_counter)
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    """Tokens whose keys and values are in the KV cache."""
    num_indexed_blocks: int = 0
    """Leading blocks of block_table that the prefix cache indexes (kv.prefix_cache.STOP:
    the rest are not indexed)."""
    status: Status = Status.WAITING
    finish_reason: FinishReason | None = None
    text: str = ""
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None
    spec_stats: SpecStats = field(default_factory=SpecStats)
    logprobs: list[TokenLogprobs] | None = None
    """One per output token when params.logprobs is set (the engine sets the list)."""
    grammar: GrammarMatcher | None = None
    """The structured-output constraint's state after the output so far (params.
    structured_outputs; the engine makes it), advanced by each appended token."""

    def __post_init__(self) -> None:
        if self.params.logprobs is not None and self.logprobs is None:
            self.logprobs = []

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_decoding(self) -> bool:
        """Whether its next step decodes (decodes): one token left to compute, after its
        computed prompt."""
        return decodes(self.num_computed_tokens, 1, self.num_tokens)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def append_tokens(
        self,
        tokens: Sequence[int],
        decode: Callable[[list[int]], str],
        logprobs: Sequence[TokenLogprobs] | None = None,
    ) -> None:
        """Append sampled tokens in order (with their logprobs, one each, when the request asks
        for them), stopping at the first that ends the request (EOS, a stop id, a stop string,
        max_tokens, the context limit); later ones are dropped."""
        now = time.perf_counter()
        for i, token in enumerate(tokens):
            self.output_token_ids.append(token)
            self.token_times.append(now)
            if self.grammar is not None:
                self.grammar.advance(token)
            if self.logprobs is not None and logprobs is not None:
                self.logprobs.append(logprobs[i])
            reason = self._finish_reason(token, decode)
            if reason is not None:
                self.finish_reason = reason
                self.status = Status.FINISHED
                self.finish_time = now
                return

    def _finish_reason(self, token: int, decode: Callable[[list[int]], str]) -> FinishReason | None:
        p = self.params
        if (token in self.eos_token_ids and not p.ignore_eos) or token in p.stop_token_ids:
            self.text = decode(self.output_token_ids[:-1])
            return "stop"
        if p.stop:
            self.text = decode(self.output_token_ids)
            if self._truncate_at_stop_string():
                return "stop"
        if len(self.output_token_ids) >= p.max_tokens or self.num_tokens >= self.max_model_len:
            self.text = decode(self.output_token_ids)
            return "length"
        return None

    def _truncate_at_stop_string(self) -> bool:
        """Cut text at the earliest stop string that the last token completed; True if found."""
        hits = [(self.text.find(s), s) for s in self.params.stop]
        hits = [(i, s) for i, s in hits if i >= 0]
        if not hits:
            return False
        index, stop = min(hits)
        end = index + len(stop) if self.params.include_stop_str_in_output else index
        self.text = self.text[:end]
        return True

    def output(self, decode: Callable[[list[int]], str]) -> RequestOutput:
        """Snapshot for the caller; text is final once the request finished."""
        # An aborted request is finished without a reason, and its text was never set.
        text = self.text if self.finish_reason is not None else decode(self.output_token_ids)
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            text=text,
            token_ids=list(self.output_token_ids),
            finish_reason=self.finish_reason,
            metrics=self.metrics(),
            logprobs=None if self.logprobs is None else list(self.logprobs),
        )

    def metrics(self) -> RequestMetrics:
        """TTFT, inter-token gaps and end-to-end time from the recorded token times."""
        times = self.token_times
        return RequestMetrics(
            num_prompt_tokens=len(self.prompt_token_ids),
            num_output_tokens=len(self.output_token_ids),
            ttft_s=times[0] - self.arrival_time if times else None,
            itl_s=[b - a for a, b in itertools.pairwise(times)],
            e2e_s=(self.finish_time - self.arrival_time) if self.finish_time else None,
            spec=copy.deepcopy(self.spec_stats),
        )


def decodes(computed: int, new_tokens: int, num_tokens: int) -> bool:
    """Whether a step that computes `new_tokens` of a request's `num_tokens` tokens, `computed`
    of them already in the KV cache, decodes it: its prompt is computed, and the one new token
    is its last, so the step samples the next (verifying any drafts after it). A prompt's
    chunks, a whole 1-token prompt among them, are prefill. The one definition the scheduler
    (Request.is_decoding) and the engine's step timing (ScheduledRequest.is_decode) apply.

    >>> decodes(9, 1, 10), decodes(0, 1, 1), decodes(6, 4, 10), decodes(5, 1, 10)
    (True, False, False, False)
    """
    return computed > 0 and new_tokens == 1 and computed + new_tokens == num_tokens


def all_greedy(requests: Sequence[TokenHistory]) -> bool:
    """True when every request takes its argmax (greedy, no penalties): its target p and a
    drafter's q are then one-hot, and only raw logits' argmaxes matter."""
    return all(r.params.greedy and not r.params.needs_penalties for r in requests)


def noise_key(request: TokenHistory, offset: int = 0) -> NoiseKey | None:
    """The noise key of the token `offset` positions after a seeded request's output so far
    (its seed, that output position: sample/noise.py); None without a seed (the engine's
    shared generator). A drafter's j-th draft and verify row j use offset j."""
    seed = request.params.seed
    return None if seed is None else NoiseKey(seed, len(request.output_token_ids) + offset)


def sampling_tensors(
    rows: Sequence[tuple[TokenHistory, Sequence[int]]], vocab_size: int, device: torch.device
) -> SamplingTensors:
    """Warping tensors for logits rows, each given as (request, draft tokens that row's history
    holds after the request's output). Histories matter for penalties and for a grammar's mask,
    so the per-row copy is made only then: target and drafter warp identically
    (docs/design.md, 3)."""
    outputs = [
        r.output_token_ids + list(extra) if extra and r.params.needs_penalties
        else r.output_token_ids
        for r, extra in rows
    ]  # fmt: skip
    return SamplingTensors.build(
        [r.params for r, _ in rows], [r.prompt_token_ids for r, _ in rows], outputs, vocab_size,
        device, grammar_masks(rows, vocab_size),
    )  # fmt: skip


def grammar_masks(
    rows: Sequence[tuple[TokenHistory, Sequence[int]]], vocab_size: int
) -> torch.Tensor | None:
    """[n, vocab] bool: each row's structured-output mask after its history (all True for rows
    of unconstrained requests); None when no request has a grammar. A request's rows are
    masked in one pass of its matcher (GrammarMatcher.masks)."""
    if all(r.grammar is None for r, _ in rows):
        return None
    allowed = torch.ones(len(rows), vocab_size, dtype=torch.bool)  # [n, vocab]
    by_request: dict[int, list[int]] = {}
    for i, (r, _) in enumerate(rows):
        if r.grammar is not None:
            by_request.setdefault(id(r), []).append(i)
    for indices in by_request.values():
        request = rows[indices[0]][0]
        assert request.grammar is not None
        allowed[indices] = request.grammar.masks([rows[i][1] for i in indices])
    return allowed


def check_prompt(ids: list[int], vocab_size: int, max_model_len: int) -> None:
    """A ValueError unless ids is a prompt the engine can run: a non-empty list of token ids
    in the vocabulary, short enough to leave room for one output token."""
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in ids
    ):
        raise ValueError("a prompt must be a string or a list of integer token ids")
    if not ids:
        raise ValueError("the prompt is empty; give at least one token")
    bad = next((i for i in ids if not 0 <= i < vocab_size), None)
    if bad is not None:
        raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {vocab_size})")
    if len(ids) >= max_model_len:
        raise ValueError(
            f"the prompt has {len(ids)} tokens but max_model_len is {max_model_len}; "
            f"at most {max_model_len - 1} prompt tokens leave room for one output token"
        )
