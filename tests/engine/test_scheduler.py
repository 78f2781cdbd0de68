"""Scheduler: chunked prefill, admission order and limits, and recompute preemption.

No model: `run_step` does what Engine.step does to the bookkeeping (advance num_computed_tokens
by each chunk, append one token to every request whose chunk samples, free finished ones), with
a fake "model" whose next token is a pure function of the request's tokens so far.
"""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace
from typing import NamedTuple

from hypothesis import example, given, settings
from hypothesis import strategies as st

from verispec.engine.prefill_pace import PrefillPace
from verispec.engine.request import Request, Status
from verispec.engine.scheduler import ScheduledRequest, Scheduler, step_kind
from verispec.engine.step_drafts import StepDrafts
from verispec.kv import BlockAllocator, BlockTable
from verispec.sample.rejection import Verdict
from verispec.types.sampling_params import SamplingParams
from verispec.types.stats import SpecStats

EOS = 1


def decode(ids: list[int]) -> str:
    return "".join(chr(97 + i % 26) for i in ids)


def next_token(request: Request) -> int:
    """The fake model: deterministic in the tokens so far, never EOS."""
    ids = request.all_token_ids
    return 3 + (sum(ids) * 31 + len(ids)) % 97


_ids = itertools.count()


def make_request(
    allocator: BlockAllocator, prompt_len: int, max_tokens: int = 4, block_size: int = 4
) -> Request:
    return Request(
        request_id=f"r{next(_ids)}",
        prompt=None,
        prompt_token_ids=[3 + i % 90 for i in range(prompt_len)],
        params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        block_table=BlockTable(allocator, block_size),
        eos_token_ids=frozenset({EOS}),
        max_model_len=1024,
    )


class Chunk(NamedTuple):
    """What a step scheduled for one request, as it was before the step's tokens arrived."""

    request: Request
    start: int
    token_ids: list[int]
    samples: bool


def run_step(scheduler: Scheduler) -> list[Chunk]:
    """One engine step over the bookkeeping; returns what was scheduled."""
    plan = scheduler.schedule()
    scheduled = plan.scheduled
    chunks = [Chunk(s.request, s.start, s.token_ids, s.samples) for s in scheduled]
    assert scheduled, "nothing runnable although requests are unfinished"
    for s in scheduled:
        assert s.start == s.request.num_computed_tokens
        assert s.is_decode == s.request.is_decoding  # one definition, seen from either side
        assert s.token_ids == s.request.all_token_ids[s.start : s.start + len(s.token_ids)]
        assert s.slots == s.request.block_table.slots(s.start, s.start + len(s.token_ids))
    tokens = [[next_token(s.request)] for s in plan.sampling]
    verdict = Verdict(token_ids=tokens, num_accepted=[0] * len(tokens))
    totals = SpecStats()
    finished = scheduler.update(plan, StepDrafts.none(len(scheduled)), verdict, decode, totals)
    for s in scheduled:
        assert s.request.num_computed_tokens == s.start + len(s.token_ids)
    assert finished == [s.request for s in plan.sampling if s.request.finished]
    assert all(r not in scheduler.running for r in finished)
    return chunks


def shape(scheduled: list[Chunk]) -> list[tuple[str, int, bool]]:
    return [(s.request.request_id, len(s.token_ids), s.samples) for s in scheduled]


def test_long_prompt_is_prefilled_in_budget_sized_chunks() -> None:
    alloc = BlockAllocator(32)
    scheduler = Scheduler(max_num_seqs=4, max_num_batched_tokens=16)
    r = make_request(alloc, prompt_len=50, max_tokens=3)
    scheduler.add(r)
    chunks = [run_step(scheduler)[0] for _ in range(4)]
    assert [(s.start, len(s.token_ids), s.samples) for s in chunks] == [
        (0, 16, False),
        (16, 16, False),
        (32, 16, False),
        (48, 2, True),
    ]
    assert len(r.output_token_ids) == 1 and r.num_computed_tokens == 50
    assert r.block_table.num_tokens == 50 and len(r.block_table.blocks) == math.ceil(50 / 4)
    decode_step = run_step(scheduler)[0]  # then one token per step
    assert (decode_step.start, decode_step.token_ids, decode_step.samples) == (
        50,
        [r.output_token_ids[0]],
        True,
    )
    run_step(scheduler)
    assert r.finished and not scheduler.has_unfinished() and alloc.num_used == 0


def test_running_requests_come_first_and_share_the_budget() -> None:
    alloc = BlockAllocator(64)
    scheduler = Scheduler(max_num_seqs=8, max_num_batched_tokens=16)
    a = make_request(alloc, prompt_len=10)
    scheduler.add(a)
    run_step(scheduler)  # a is prefilled and decoding
    b, c = make_request(alloc, prompt_len=20), make_request(alloc, prompt_len=5)
    scheduler.add(b)
    scheduler.add(c)
    # a decodes 1 token, b gets the remaining 15 of its 20, c does not fit this step.
    step = run_step(scheduler)
    assert shape(step) == [(a.request_id, 1, True), (b.request_id, 15, False)]
    assert list(scheduler.waiting) == [c] and scheduler.running == [a, b]
    step = run_step(scheduler)
    assert shape(step) == [
        (a.request_id, 1, True),
        (b.request_id, 5, True),
        (c.request_id, 5, True),
    ]
    assert sum(len(s.token_ids) for s in step) <= 16


def test_budget_split_between_two_new_prompts() -> None:
    alloc = BlockAllocator(64)
    scheduler = Scheduler(max_num_seqs=8, max_num_batched_tokens=16)
    a, b, c = (make_request(alloc, prompt_len=10) for _ in range(3))
    for r in (a, b, c):
        scheduler.add(r)
    step = run_step(scheduler)
    assert shape(step) == [(a.request_id, 10, True), (b.request_id, 6, False)]
    assert list(scheduler.waiting) == [c]  # the budget is spent, c waits


def test_max_num_seqs_caps_admission() -> None:
    alloc = BlockAllocator(64)
    scheduler = Scheduler(max_num_seqs=2, max_num_batched_tokens=64)
    a = make_request(alloc, prompt_len=3, max_tokens=1)
    b = make_request(alloc, prompt_len=3, max_tokens=5)
    c = make_request(alloc, prompt_len=3, max_tokens=5)
    for r in (a, b, c):
        scheduler.add(r)
    step = run_step(scheduler)  # a finishes on its first token, freeing a seat
    assert [s.request for s in step] == [a, b]
    assert a.finished and scheduler.running == [b] and list(scheduler.waiting) == [c]
    step = run_step(scheduler)
    assert [s.request for s in step] == [b, c] and scheduler.running == [b, c]


def test_max_num_seqs_one_runs_requests_one_after_another() -> None:
    alloc = BlockAllocator(64)
    scheduler = Scheduler(max_num_seqs=1, max_num_batched_tokens=64)
    requests = [make_request(alloc, prompt_len=4, max_tokens=3) for _ in range(3)]
    for r in requests:
        scheduler.add(r)
    served = []
    while scheduler.has_unfinished():
        step = run_step(scheduler)
        assert len(step) == 1 and len(scheduler.running) <= 1
        served.append(step[0].request)
    # Each request runs to the end (prefill + 2 decode steps) before the next is admitted.
    assert served == [r for r in requests for _ in range(3)]


def test_newest_running_request_is_preempted_and_loses_nothing() -> None:
    # 4 blocks of 4 slots. a (8 tokens) and b (7 tokens) fill all of them; a's first output
    # token needs a 5th block, so b (the newest) is preempted to make room.
    alloc = BlockAllocator(4)
    scheduler = Scheduler(max_num_seqs=2, max_num_batched_tokens=64)
    a = make_request(alloc, prompt_len=8, max_tokens=6)
    b = make_request(alloc, prompt_len=7, max_tokens=6)
    c = make_request(alloc, prompt_len=2, max_tokens=1)
    for r in (a, b, c):
        scheduler.add(r)
    assert shape(run_step(scheduler)) == [(a.request_id, 8, True), (b.request_id, 7, True)]
    assert alloc.num_free == 0
    b_output = list(b.output_token_ids)

    step = run_step(scheduler)
    assert [s.request for s in step] == [a]
    assert b.status is Status.WAITING and list(scheduler.waiting) == [b, c]
    assert b.num_computed_tokens == 0 and b.block_table.blocks == []
    assert b.block_table.num_tokens == 0
    assert b.output_token_ids == b_output  # kept: it is recomputed, not restarted
    assert scheduler.running == [a] and alloc.num_used == len(a.block_table.blocks) == 3

    # b comes back first once a finishes, recomputing its prompt and its output token at once.
    while not a.finished:
        run_step(scheduler)
    step = run_step(scheduler)
    assert step[0].request is b
    assert (step[0].start, step[0].token_ids) == (0, b.prompt_token_ids + b_output)
    assert step[0].samples and len(b.output_token_ids) == 2


def test_preempted_request_ends_with_the_same_tokens_as_unpreempted() -> None:
    def outputs(num_blocks: int) -> tuple[list[list[int]], int]:
        alloc = BlockAllocator(num_blocks)
        scheduler = Scheduler(max_num_seqs=4, max_num_batched_tokens=32)
        requests = [make_request(alloc, prompt_len=n, max_tokens=9) for n in (8, 7, 5, 11)]
        for r in requests:
            scheduler.add(r)
        preemptions = 0
        while scheduler.has_unfinished():
            running = list(scheduler.running)
            run_step(scheduler)
            preemptions += sum(r.status is Status.WAITING for r in running)
        assert alloc.num_used == 0
        return [r.output_token_ids for r in requests], preemptions

    small, preemptions = outputs(num_blocks=5)  # 5 blocks hold just the longest (20 tokens)
    large, no_preemptions = outputs(num_blocks=64)
    assert small == large
    assert preemptions > 0 and no_preemptions == 0


def test_preempting_itself_when_it_is_the_newest() -> None:
    # a (7 tokens) and b (8 tokens) fill 4 blocks; b's output token needs a 5th block, and b is
    # the newest, so b preempts itself while a keeps decoding.
    alloc = BlockAllocator(4)
    scheduler = Scheduler(max_num_seqs=2, max_num_batched_tokens=64)
    a = make_request(alloc, prompt_len=7, max_tokens=6)
    b = make_request(alloc, prompt_len=8, max_tokens=6)
    scheduler.add(a)
    scheduler.add(b)
    run_step(scheduler)
    step = run_step(scheduler)
    assert [s.request for s in step] == [a]
    assert list(scheduler.waiting) == [b] and b.num_computed_tokens == 0
    assert len(b.output_token_ids) == 1


def test_abort_drops_waiting_and_running_requests() -> None:
    alloc = BlockAllocator(16)
    scheduler = Scheduler(max_num_seqs=1, max_num_batched_tokens=64)
    a, b = make_request(alloc, prompt_len=6), make_request(alloc, prompt_len=3)
    scheduler.add(a)
    scheduler.add(b)
    run_step(scheduler)
    assert scheduler.running == [a] and list(scheduler.waiting) == [b] and alloc.num_used == 2
    scheduler.abort(b)
    scheduler.abort(a)
    assert a.finished and b.finished and len(a.output_token_ids) == 1
    assert not scheduler.has_unfinished() and alloc.num_used == 0


def test_a_long_prefill_never_stalls_decodes_or_short_prompts() -> None:
    """A decoding request and a short prompt arriving after a long one are scheduled every
    step, ahead of the long prompt, whose chunk is capped while they run; alone, it takes the
    whole budget."""
    alloc = BlockAllocator(128)
    scheduler = Scheduler(max_num_seqs=8, max_num_batched_tokens=64, long_prefill_chunk=8)
    a = make_request(alloc, prompt_len=4, max_tokens=12)
    scheduler.add(a)
    run_step(scheduler)  # a decodes from now on
    long, short = make_request(alloc, prompt_len=200), make_request(alloc, 6, max_tokens=5)
    scheduler.add(long)
    scheduler.add(short)
    assert shape(run_step(scheduler)) == [
        (a.request_id, 1, True), (short.request_id, 6, True), (long.request_id, 8, False)
    ]  # fmt: skip
    while not a.finished:
        step = shape(run_step(scheduler))
        if not short.finished:
            assert step[:2] == [(a.request_id, 1, True), (short.request_id, 1, True)]
        assert step[0] == (a.request_id, 1, True) and step[-1] == (long.request_id, 8, False)
    assert short.finished and long.num_computed_tokens == 8 * 11  # a decoded 11 tokens
    assert [len(c.token_ids) for c in run_step(scheduler)] == [64]  # alone: the whole budget


def test_a_waiting_long_prompt_keeps_its_seat() -> None:
    """Seats go in arrival order: a short prompt behind a long one gets no seat the long one
    is owed, and the long one is admitted with a capped chunk beside the decode."""
    alloc = BlockAllocator(128)
    scheduler = Scheduler(max_num_seqs=2, max_num_batched_tokens=64, long_prefill_chunk=8)
    a = make_request(alloc, prompt_len=4, max_tokens=12)
    scheduler.add(a)
    run_step(scheduler)
    long, short = make_request(alloc, prompt_len=100), make_request(alloc, prompt_len=6)
    scheduler.add(long)
    scheduler.add(short)
    assert shape(run_step(scheduler)) == [(a.request_id, 1, True), (long.request_id, 8, False)]
    assert list(scheduler.waiting) == [short] and scheduler.running == [a, long]


def test_the_pace_grants_long_prefill_tokens_beside_other_work() -> None:
    """With a pace, long prefills beside other work take what it grants (0: none this step,
    and the decode runs alone); the plan says how many they took, for the pace to measure."""

    class Grants(PrefillPace):
        def grant(self, cap: int, alone: bool = False) -> int:
            assert not alone
            return min(cap, grants.pop(0))

    grants = [0, 3, 100]
    alloc = BlockAllocator(128)
    scheduler = Scheduler(8, 64, long_prefill_chunk=8, pace=Grants())
    a = make_request(alloc, prompt_len=4, max_tokens=12)
    scheduler.add(a)
    plan = scheduler.schedule()
    assert plan.paced == 0 and not plan.alone  # no long prefill: a plain step
    long = make_request(alloc, prompt_len=100)
    scheduler.add(long)
    for expected in ([], [(long.request_id, 3, False)], [(long.request_id, 8, False)]):
        scheduler.update(plan, StepDrafts.none(len(plan.scheduled)),
                         Verdict(token_ids=[[5]] * len(plan.sampling),
                                 num_accepted=[0] * len(plan.sampling)),
                         decode, SpecStats())  # fmt: skip
        plan = scheduler.schedule()
        assert shape([Chunk(s.request, s.start, s.token_ids, s.samples)
                      for s in plan.scheduled]) == [(a.request_id, 1, True), *expected]  # fmt: skip
        assert plan.paced == sum(n for _, n, _ in expected)


def test_alone_a_long_prefill_takes_what_the_pace_grants() -> None:
    """With nothing else to run, a long prefill's chunk is the pace's lone grant (asked with
    the whole budget as its cap), and the plan says the step was its alone."""
    asked = []

    class Grants(PrefillPace):
        def grant(self, cap: int, alone: bool = False) -> int:
            asked.append((cap, alone))
            return 5

    alloc = BlockAllocator(128)
    scheduler = Scheduler(8, 64, long_prefill_chunk=8, pace=Grants())
    long = make_request(alloc, prompt_len=100)
    scheduler.add(long)
    plan = scheduler.schedule()
    assert [len(s.token_ids) for s in plan.scheduled] == [5]
    assert plan.paced == 5 and plan.alone and asked == [(64, True)]


@settings(max_examples=200, deadline=None)
# A request that preempts itself must not be readmitted in the same step: it took the whole
# budget before a long running prefill got any, and was preempted again, for ever.
@example(prompt_lens=[1, 1, 9, 4], max_tokens=2, budget=4, max_num_seqs=3, block_size=1,
         spare_blocks=0, chunk=5)  # fmt: skip
@given(
    prompt_lens=st.lists(st.integers(1, 30), min_size=1, max_size=6),
    max_tokens=st.integers(1, 10),
    budget=st.integers(1, 40),
    max_num_seqs=st.integers(1, 5),
    block_size=st.integers(1, 8),
    spare_blocks=st.integers(0, 12),
    chunk=st.none() | st.integers(1, 40),
)
def test_any_workload_finishes_with_the_same_tokens(
    prompt_lens: list[int],
    max_tokens: int,
    budget: int,
    max_num_seqs: int,
    block_size: int,
    spare_blocks: int,
    chunk: int | None,
) -> None:
    """Whatever the budget, long-prefill chunk, seat count and cache size (at least one full
    sequence), every request ends with exactly the tokens it gets alone, within the limits,
    leaking no block."""

    def run(
        num_blocks: int, seqs: int, tokens_per_step: int, chunk: int | None = None
    ) -> list[list[int]]:
        alloc = BlockAllocator(num_blocks)
        scheduler = Scheduler(seqs, tokens_per_step, long_prefill_chunk=chunk)
        requests = [make_request(alloc, n, max_tokens, block_size) for n in prompt_lens]
        for r in requests:
            scheduler.add(r)
        for _ in range(10_000):
            if not scheduler.has_unfinished():
                break
            step = run_step(scheduler)
            assert sum(len(s.token_ids) for s in step) <= tokens_per_step
            assert len(scheduler.running) <= seqs
            assert len({id(s.request) for s in step}) == len(step)
            held = sum(len(r.block_table.blocks) for r in scheduler.running)
            assert held == alloc.num_used
            assert all(not r.block_table.blocks for r in scheduler.waiting)
        assert not scheduler.has_unfinished() and alloc.num_used == 0
        assert all(r.finish_reason == "length" for r in requests)
        return [r.output_token_ids for r in requests]

    longest = max(prompt_lens) + max_tokens
    one_seq = math.ceil(longest / block_size)
    reference = run(num_blocks=len(prompt_lens) * one_seq, seqs=8, tokens_per_step=1024)
    assert run(one_seq + spare_blocks, max_num_seqs, budget, chunk) == reference


def test_step_kind_names_plain_decode_and_verify_steps() -> None:
    request = SimpleNamespace(num_tokens=10)

    def kind(*chunks: tuple[int, int] | tuple[int, int, int]) -> str | None:
        """step_kind of chunks given as (tokens, drafts) or (tokens, drafts, start)."""
        scheduled = [ScheduledRequest(request, c[2] if len(c) > 2 else 9, [1] * c[0], [])  # type: ignore[arg-type, misc]
                     for c in chunks]  # fmt: skip
        drafts = StepDrafts([[2] * c[1] for c in chunks], [None] * len(chunks))
        return step_kind(scheduled, drafts)

    assert kind((1, 0), (1, 0)) == "decode"
    assert kind((1, 3), (1, 1)) == "verify"
    assert kind((1, 3), (1, 0)) is None  # a mix
    assert kind((4, 0, 6)) is None  # a prompt chunk
    assert kind((1, 0, 5)) is None  # a chunk that samples nothing
    assert kind() is None
