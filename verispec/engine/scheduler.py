"""Scheduler: which requests run in the next forward and how many new tokens each brings."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from verispec.api.outputs import TokenLogprobs
from verispec.engine.request import Request, Status, decodes
from verispec.engine.stats import SpecStats
from verispec.kv import CacheExhaustedError, DrafterPrefix, PrefixCache
from verispec.sample.rejection import Verdict
from verispec.sample.tree import DraftTree
from verispec.spec.policy import AdaptiveSpeculation


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
    """Draft tokens this request may verify this step (k, shrunk near its limits)."""
    draft_token_ids: list[int] = field(default_factory=list)
    """Filled by the drafter: at most num_draft_slots tokens after token_ids."""
    draft_tree: DraftTree | None = None
    """The tree draft_token_ids form (its nodes, in order); None = a chain."""
    is_decode: bool = field(init=False)
    """Whether this step decodes the request (engine.request.decodes: its one new token is its
    last, after its computed prompt), fixed when the plan is made, as Schedule.sampling is."""

    def __post_init__(self) -> None:
        self.is_decode = decodes(self.start, len(self.token_ids), self.request.num_tokens)

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the end of the request's tokens, so a token is sampled."""
        return self.start + len(self.token_ids) == self.request.num_tokens


def step_kind(scheduled: Sequence[ScheduledRequest]) -> str | None:
    """"decode" when every request of a step decodes (ScheduledRequest.is_decode) without
    drafts, "verify" when every one decodes and verifies drafts, else None (a prompt chunk, or a
    mix): the kinds StepTimes.record counts. Example: two requests decoding, one with three
    drafts: None; both with drafts: "verify"; both without: "decode"."""
    if not scheduled or not all(s.is_decode for s in scheduled):
        return None
    drafted = [bool(s.draft_token_ids) for s in scheduled]
    return "verify" if all(drafted) else None if any(drafted) else "decode"


@dataclass(slots=True)
class Schedule:
    """One step's plan: the chunks to compute, and the requests preempted to make room."""

    scheduled: list[ScheduledRequest]
    preempted: list[Request]
    """Requests whose KV was freed this step (their drafter state must go too)."""
    sampling: list[ScheduledRequest] = field(init=False)
    """The scheduled requests that receive tokens this step (rows of the verdict), fixed when
    the plan is made: once tokens are appended a chunk no longer reaches the end."""

    def __post_init__(self) -> None:
        self.sampling = [s for s in self.scheduled if s.samples]


class Scheduler:
    """Continuous batching with chunked prefill: running requests first, then admit waiting ones
    while the token budget, max_num_seqs and free KV blocks allow. When the cache runs out,
    the newest running request is preempted (its blocks freed, recomputed later), never dropped."""

    def __init__(
        self,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        num_speculative_tokens: int = 0,
        prefix_cache: PrefixCache | None = None,
        policy: AdaptiveSpeculation | None = None,
        drafter_prefix: DrafterPrefix | None = None,
    ) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
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
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> Schedule:
        """Pick this step's work; every scheduled request has its KV slots reserved."""
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[Request] = []
        self._plan_drafts(budget)
        for request in list(self.running):
            if budget == 0 or request not in self.running:  # preempted meanwhile
                continue
            item = self._reserve(request, budget, scheduled, preempted)
            if item is not None:
                scheduled.append(item)
                budget -= len(item.slots)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            item = self._try_reserve(request, budget)
            if item is None:
                break
            self.waiting.popleft()
            request.status = Status.RUNNING
            self.running.append(request)
            scheduled.append(item)
            budget -= len(item.slots)
        return Schedule(scheduled, preempted)

    def update(
        self,
        plan: Schedule,
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
        for i, (s, tokens, accepted) in enumerate(
            zip(plan.sampling, verdict.token_ids, verdict.num_accepted, strict=True)
        ):
            request = s.request
            request.num_computed_tokens += accepted
            request.block_table.truncate(request.num_computed_tokens)
            request.spec_stats.record(len(s.draft_token_ids), accepted)
            totals.record(len(s.draft_token_ids), accepted)
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
        k = self._num_drafts(request, budget - 1) if decoding else 0
        try:
            slots = request.block_table.append_slots(num_new + k)
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
        return ScheduledRequest(request, start, ids, slots, num_draft_slots=k)

    def _plan_drafts(self, budget: int) -> None:
        """Ask the policy for each running decoding request's k, with one token per decoding
        request as the base cost: prefill chunks cost both choices alike, and leaving them out
        can only make drafting look less worth it (a conservative error). Requests with
        speculation off (SamplingParams.speculative) count in the base and are not asked about."""
        self._planned = {}
        if self.policy is None:
            return
        decoding = [r for r in self.running if r.is_decoding]
        drafting = [r for r in decoding if r.params.speculative]
        ks = self.policy.choose([r.request_id for r in drafting], min(len(decoding), budget))
        self._planned = {id(r): k for r, k in zip(drafting, ks, strict=True)}  # fmt: skip

    def _num_drafts(self, request: Request, budget: int) -> int:
        """k for a decoding request (the policy's choice, else num_speculative_tokens), shrunk
        so drafts fit the token budget, the context limit (the last draft's position stays
        below max_model_len) and max_tokens (k + 1 emitted); 0 for a request that turned
        speculation off (SamplingParams.speculative: plain decoding, the reference of
        `verispec verify`)."""
        if not request.params.speculative:
            return 0
        left = request.params.max_tokens - len(request.output_token_ids)
        limit = min(budget, request.max_model_len - request.num_tokens, left - 1)
        k = self._planned.get(id(request), self.num_speculative_tokens)
        return max(0, min(k, limit))

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
