"""Scheduler: which requests run in the next forward and how many new tokens each brings."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from verispec.engine.drafter import DrafterPrefix
from verispec.engine.prefill_pace import PrefillPace
from verispec.engine.request import Request, Status, decodes
from verispec.engine.step_drafts import StepDrafts
from verispec.kv import CacheExhaustedError, PrefixCache
from verispec.sample.rejection import Verdict
from verispec.spec.policy import AdaptiveSpeculation
from verispec.types.outputs import TokenLogprobs
from verispec.types.stats import SpecStats

MAX_FORCED_DRAFTS = 16
"""Most grammar-forced tokens a request drafts in one step: a forced run longer than that is
rare (a tool call's opening), and each draft is a verify row even when it is free to draft."""


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step: the token range it computes and where its KV goes."""

    request: Request
    start: int
    """Position of the first new token (= tokens already in the KV cache)."""
    token_ids: list[int]
    slots: list[int]
    """KV slots of token_ids, then of up to num_draft_slots draft tokens."""
    num_draft_slots: int = 0
    """Draft tokens this request may verify this step (its forced drafts, then k, shrunk near
    its limits); the drafts themselves travel apart, as the step's StepDrafts."""
    forced: list[int] = field(default_factory=list)
    """The tokens its grammar forces next, its first drafts this step (within num_draft_slots;
    none without speculation)."""
    is_decode: bool = field(init=False)
    """Whether this step decodes the request (engine.request.decodes: its one new token is its
    last, after its computed prompt), fixed when the plan is made, as Schedule.sampling is."""

    def __post_init__(self) -> None:
        self.is_decode = decodes(self.start, len(self.token_ids), self.request.num_tokens)

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the end of the request's tokens, so a token is sampled."""
        return self.start + len(self.token_ids) == self.request.num_tokens


def step_kind(scheduled: Sequence[ScheduledRequest], drafts: StepDrafts) -> str | None:
    """"decode" when every request of a step decodes (ScheduledRequest.is_decode) without
    drafts, "verify" when every one decodes and verifies drafts, else None (a prompt chunk, or a
    mix): the kinds StepTimes.record counts. Example: two requests decoding, one with three
    drafts: None; both with drafts: "verify"; both without: "decode"."""
    if not scheduled or not all(s.is_decode for s in scheduled):
        return None
    drafted = [bool(ids) for ids in drafts.token_ids]
    return "verify" if all(drafted) else None if any(drafted) else "decode"


@dataclass(slots=True)
class Schedule:
    """One step's plan: the chunks to compute, and the requests preempted to make room."""

    scheduled: list[ScheduledRequest]
    preempted: list[Request]
    """Requests whose KV was freed this step (their drafter state must go too)."""
    paced: int = 0
    """Tokens of long prefills in this step (PrefillPace measures steps with and without)."""
    alone: bool = False
    """Whether long prefills ran with nothing else (the pace caps such a step's time)."""
    sampled: list[int] = field(init=False)
    """Indices in scheduled of the requests that receive tokens this step (rows of the
    verdict), fixed when the plan is made: once tokens are appended a chunk no longer reaches
    the end."""
    sampling: list[ScheduledRequest] = field(init=False)
    """Those requests themselves, in the same order."""

    def __post_init__(self) -> None:
        self.sampled = [i for i, s in enumerate(self.scheduled) if s.samples]
        self.sampling = [self.scheduled[i] for i in self.sampled]


class Scheduler:
    """Continuous batching with chunked prefill. Each step's token budget goes first to running
    decodes (with their draft slots) and short prefills, then to waiting short prompts, and only
    then to long prefills (more than long_prefill_chunk tokens left), a chunk of at most
    long_prefill_chunk each when the step carries other work; waiting requests keep their order
    for seats (max_num_seqs); alone, a long prefill takes the whole budget, or what the pace
    grants. When the cache runs out, the newest running request is preempted (its blocks
    freed, recomputed later), never dropped."""

    def __init__(
        self,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        num_speculative_tokens: int = 0,
        prefix_cache: PrefixCache | None = None,
        policy: AdaptiveSpeculation | None = None,
        drafter_prefix: DrafterPrefix | None = None,
        long_prefill_chunk: int | None = None,
        pace: PrefillPace | None = None,
    ) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.long_prefill_chunk = long_prefill_chunk
        """A prefill with more tokens left than this is long: it goes after every other request
        of the step and then gets at most this many tokens while others run
        (EngineConfig.long_prefill_chunk); None = none is long (arrival order, whole budget)."""
        self.pace = pace
        """When set, it grants the tokens long prefills take from measured step times (the
        engine reports every step), up to long_prefill_chunk beside other work and up to the
        budget alone; else those limits."""
        self.num_speculative_tokens = num_speculative_tokens
        self.prefix_cache = prefix_cache
        """When set, a request starting from scratch reuses the cached KV of its prompt's
        longest computed prefix, and computed full blocks are indexed after each step."""
        self.drafter_prefix = drafter_prefix
        """A drafter with a prefix cache of its own (an EAGLE head): a hit is cut to the blocks
        it holds too, and it adopts them when the request is scheduled."""
        self.policy = policy
        """When set, it chooses each decoding request's k every step (up to
        num_speculative_tokens); else every decoding request gets num_speculative_tokens."""
        self._planned: dict[int, int] = {}  # id(request) -> k the policy chose this step
        self._forced: dict[int, list[int]] = {}  # id(request) -> its grammar's forced tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> Schedule:
        """Pick this step's work; every scheduled request has its KV slots reserved. Order:
        running decodes and short prefills, waiting short prompts, then long prefills (running,
        then waiting), within what the pace grants when anything came before them."""
        scheduled: list[ScheduledRequest] = []
        preempted: list[Request] = []
        self._plan_drafts(self.max_num_batched_tokens)
        long_running = [r for r in self.running if self._is_long(r)]
        for request in [r for r in self.running if r not in long_running]:
            self._schedule_running(request, scheduled, preempted, self._left(scheduled))
        seats = self.max_num_seqs - len(self.running)
        long_waiting, admitting = [], True
        for request in list(self.waiting)[: max(seats, 0)]:
            if request in preempted:  # not back this step: the requests it made room for run
                admitting = False  # first (it went back to the front of the queue)
                break
            if self._is_long(request):
                long_waiting.append(request)  # its seat is kept; its chunk comes last
            elif self._admit(request, scheduled, self._left(scheduled)) is None:
                admitting = False  # first come, first served: none jumps a blocked request
                break
        longs = long_running + (long_waiting if admitting else [])
        alone = not scheduled
        grant = self._grant(alone) if longs else None
        paced = 0
        for request in longs:
            left = self._left(scheduled, None if grant is None else grant - paced)
            if request in long_running:
                item = self._schedule_running(request, scheduled, preempted, left)
            elif (item := self._admit(request, scheduled, left)) is None:
                break
            paced += len(item.token_ids) if item is not None else 0
        return Schedule(scheduled, preempted, paced, alone and paced > 0)

    def _grant(self, alone: bool) -> int | None:
        """Tokens long prefills may take this step: beside other work long_prefill_chunk,
        alone the whole budget (None), either cut to what the pace grants."""
        if alone:
            budget = self.max_num_batched_tokens
            return None if self.pace is None else self.pace.grant(budget, alone=True)
        chunk = self.long_prefill_chunk or self.max_num_batched_tokens
        return chunk if self.pace is None else self.pace.grant(chunk)

    def _is_long(self, request: Request) -> bool:
        """Whether the request is a long prefill: more than long_prefill_chunk tokens left to
        compute, or more than one at a context past it (a long prompt's tail, a prompt the
        prefix cache mostly held, a preempted request's recompute), which cost as much a
        token (their attention reads the whole context)."""
        chunk = self.long_prefill_chunk
        left = request.num_tokens - request.num_computed_tokens
        return chunk is not None and (left > chunk or (left > 1 and request.num_tokens > chunk))

    def _left(self, scheduled: list[ScheduledRequest], cap: int | None = None) -> int:
        """Tokens the step may still take (at most cap): the budget less every reserved slot."""
        left = self.max_num_batched_tokens - sum(len(s.slots) for s in scheduled)
        return left if cap is None else min(left, cap)

    def _schedule_running(
        self,
        request: Request,
        scheduled: list[ScheduledRequest],
        preempted: list[Request],
        budget: int,
    ) -> ScheduledRequest | None:
        """Schedule a running request's next chunk within budget (preempting others if its KV
        does not fit); None when the budget is spent or it was preempted."""
        if budget <= 0 or request not in self.running:
            return None
        item = self._reserve(request, budget, scheduled, preempted)
        if item is not None:
            scheduled.append(item)
        return item

    def _admit(
        self, request: Request, scheduled: list[ScheduledRequest], budget: int
    ) -> ScheduledRequest | None:
        """Move a waiting request to running with its first chunk; None (it stays waiting)
        when the budget is spent or its KV does not fit."""
        item = self._try_reserve(request, budget) if budget > 0 else None
        if item is not None:
            self.waiting.remove(request)
            request.status = Status.RUNNING
            self.running.append(request)
            scheduled.append(item)
        return item

    def update(
        self,
        plan: Schedule,
        drafts: StepDrafts,
        verdict: Verdict,
        decode: Callable[[list[int]], str],
        totals: SpecStats,
        logprobs: Sequence[Sequence[TokenLogprobs] | None] | None = None,
    ) -> list[Request]:
        """Apply a step's verdict: count computed KV, keep accepted drafts' KV and drop the rest,
        append emitted tokens (with their logprobs, per sampling request, when given), record
        acceptance (per request and in `totals`), release finished requests' blocks. Returns
        the requests that finished this step."""
        for s in plan.scheduled:
            s.request.num_computed_tokens += len(s.token_ids)
            if not s.samples:  # a prefill chunk short of the end: its full blocks are done
                self._index(s.request)
        finished = []
        for i, (s, ids, forced, tokens, accepted) in enumerate(zip(
            plan.sampling, drafts.rows(plan.sampled), drafts.forced(plan.sampled),
            verdict.token_ids, verdict.num_accepted, strict=True,
        )):  # fmt: skip
            request = s.request
            request.num_computed_tokens += accepted
            request.block_table.truncate(request.num_computed_tokens)
            request.spec_stats.record(len(ids), accepted, forced)
            totals.record(len(ids), accepted, forced)
            request.append_tokens(tokens, decode, logprobs[i] if logprobs else None)
            self._index(request)
            if request.finished:
                self.finish(request)
                finished.append(request)
        return finished

    def finish(self, request: Request) -> None:
        """Release a finished request's KV blocks."""
        request.block_table.free()
        if request in self.running:
            self.running.remove(request)

    def abort(self, request: Request) -> None:
        """Drop an unfinished request wherever it is queued and release its KV blocks."""
        if request in self.waiting:
            self.waiting.remove(request)
        self.finish(request)
        request.status = Status.FINISHED

    def _index(self, request: Request) -> None:
        """Index the request's newly computed full blocks in the prefix cache."""
        if self.prefix_cache is not None:
            request.num_indexed_blocks = self.prefix_cache.insert(
                request.block_table, request.all_token_ids, request.num_indexed_blocks,
                request.num_computed_tokens,
            )  # fmt: skip

    def _match_prefix(self, request: Request) -> bool:
        """Start a request with no KV from the prefix cache's longest match of its tokens;
        True when it was looked up."""
        cache = self.prefix_cache
        if cache is None or request.num_computed_tokens or request.block_table.blocks:
            return False
        limit = None
        if self.drafter_prefix is not None:
            limit = self.drafter_prefix.cached_prefix_blocks(request.all_token_ids)
        blocks = cache.match(request.all_token_ids, limit)
        request.block_table.share(blocks)
        request.num_indexed_blocks = len(blocks)
        request.num_computed_tokens = request.block_table.num_tokens
        return True

    def _try_reserve(self, request: Request, budget: int) -> ScheduledRequest | None:
        looked_up = self._match_prefix(request)
        remaining = request.num_tokens - request.num_computed_tokens
        num_new = min(budget, remaining)
        # Drafts follow the first forward: a drafter reading the target's features has none
        # before it (a 1-token prompt, or a prompt cached but for its last token, would
        # otherwise draft at once).
        decoding = request.is_decoding and not looked_up
        forced, k = self._num_drafts(request, budget - 1) if decoding else ([], 0)
        try:
            slots = request.block_table.append_slots(num_new + len(forced) + k)
        except CacheExhaustedError:
            if looked_up:  # give the shared blocks back; the lookup is retried next time
                request.block_table.free()
                request.num_computed_tokens = request.num_indexed_blocks = 0
            return None
        if looked_up and self.prefix_cache is not None:
            self.prefix_cache.record(request.num_tokens, request.num_computed_tokens)
            if self.drafter_prefix is not None:
                self.drafter_prefix.adopt_prefix(request.request_id, request.all_token_ids,
                                                 request.num_indexed_blocks)  # fmt: skip
        start = request.num_computed_tokens
        ids = request.all_token_ids[start : start + num_new]
        return ScheduledRequest(request, start, ids, slots, len(forced) + k, forced)

    def _plan_drafts(self, budget: int) -> None:
        """Find each running decoding request's forced tokens (those with a grammar), and ask
        the policy for each one's k, with one token per decoding request and its forced drafts
        as the base cost: prefill chunks cost both choices alike, and leaving them out can only
        make drafting look less worth it (a conservative error). Requests with speculation off
        (SamplingParams.speculative) count in the base and are not asked about."""
        self._planned, self._forced = {}, {}
        decoding = [r for r in self.running if r.is_decoding]
        drafting = [r for r in decoding if r.params.speculative and self.num_speculative_tokens]
        for r in drafting:
            if r.grammar is not None:
                self._forced[id(r)] = r.grammar.forced_tokens(MAX_FORCED_DRAFTS)
        if self.policy is None:
            return
        # forced drafts are verify rows of the step whatever k is: they count in the base
        forced = sum(len(f) for f in self._forced.values())
        ks = self.policy.choose([r.request_id for r in drafting],
                                min(len(decoding) + forced, budget), forced)  # fmt: skip
        self._planned = {id(r): k for r, k in zip(drafting, ks, strict=True)}  # fmt: skip

    def _num_drafts(self, request: Request, budget: int) -> tuple[list[int], int]:
        """A decoding request's drafts this step: the tokens its grammar forces (up to
        MAX_FORCED_DRAFTS: free to draft, docs/design.md, 3) and k more (the policy's choice,
        else num_speculative_tokens), all shrunk so drafts fit the token budget, the context
        limit (the last draft's position stays below max_model_len) and max_tokens (drafts
        + 1 emitted); none without speculation, or for a request that turned it off
        (SamplingParams.speculative: plain decoding, the reference of `verispec verify`)."""
        if not request.params.speculative or self.num_speculative_tokens == 0:
            return [], 0
        left = request.params.max_tokens - len(request.output_token_ids)
        limit = max(0, min(budget, request.max_model_len - request.num_tokens, left - 1))
        forced = self._forced.get(id(request), [])[:limit]
        k = self._planned.get(id(request), self.num_speculative_tokens)
        return forced, max(0, min(k, limit - len(forced)))

    def _reserve(
        self,
        request: Request,
        budget: int,
        scheduled: list[ScheduledRequest],
        preempted: list[Request],
    ) -> ScheduledRequest | None:
        """Reserve slots for a running request, preempting the newest others until it fits."""
        while True:
            item = self._try_reserve(request, budget)
            if item is not None:
                return item
            victim = self.running[-1]
            self._preempt(victim, scheduled)
            preempted.append(victim)
            if victim is request:
                return None

    def _preempt(self, victim: Request, scheduled: list[ScheduledRequest]) -> None:
        """Free a request's blocks and requeue it at the front (it will be recomputed)."""
        scheduled[:] = [s for s in scheduled if s.request is not victim]
        self.running.remove(victim)
        victim.block_table.free()
        victim.num_computed_tokens = victim.num_indexed_blocks = 0
        victim.status = Status.WAITING
        self.waiting.appendleft(victim)
