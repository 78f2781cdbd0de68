"""Engine on a tiny random Llama: batching, chunked prefill, seat limits and preemption never
change greedy tokens (docs/design.md 3: equality, not similarity), and seeded sampling is
reproducible whatever the batch around it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from verispec import LLM, SamplingParams
from verispec.config import EngineConfig
from verispec.engine.request import Status
from verispec.types.outputs import RequestOutput
from verispec.types.stats import PHASES, StepTimes

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: a second thread only waits

Prompt = str | list[int]
PROMPTS: list[Prompt] = [
    "def add(a, b):",
    [0, 5, 6, 7],
    "for i in range(10):\n    print(i * i)\n",
    "class",
    [0, *range(40, 60)],
    "The quick brown fox jumps over the lazy dog.",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


def seeded(seed: int, max_tokens: int = 12) -> SamplingParams:
    return SamplingParams(
        temperature=0.8, top_p=0.9, seed=seed, max_tokens=max_tokens, ignore_eos=True
    )


def token_ids(outputs: list[RequestOutput]) -> list[list[int]]:
    return [o.token_ids for o in outputs]


@pytest.fixture(scope="module")
def make_llm(llama_checkpoint: Path) -> Callable[..., LLM]:
    """LLM over the tiny checkpoint, one per distinct set of options in this module."""
    cache: dict[tuple[tuple[str, Any], ...], LLM] = {}

    def get(**options: Any) -> LLM:
        key = tuple(sorted(options.items()))
        if key not in cache:
            cache[key] = LLM(model=str(llama_checkpoint), **options)
        return cache[key]

    return get


@pytest.fixture(scope="module")
def alone(make_llm: Callable[..., LLM]) -> list[list[int]]:
    """Greedy tokens of each prompt generated on its own."""
    llm = make_llm()
    return [llm.generate(p, GREEDY)[0].token_ids for p in PROMPTS]


def generate_counting_preemptions(
    llm: LLM, prompts: list[Prompt], params: SamplingParams
) -> tuple[list[list[int]], int]:
    """Drive the engine step by step; count running requests sent back to waiting."""
    engine = llm.engine
    requests = [engine.add_request(p, params) for p in prompts]
    preemptions = 0
    while engine.has_unfinished():
        running = list(engine.scheduler.running)
        engine.step()
        preemptions += sum(r.status is Status.WAITING for r in running)
    assert engine.allocator.num_used == 0
    return [r.output_token_ids for r in requests], preemptions


def test_greedy_outputs_are_full_length(alone: list[list[int]]) -> None:
    assert all(len(ids) == GREEDY.max_tokens for ids in alone)
    assert len({tuple(ids) for ids in alone}) == len(PROMPTS)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"max_num_batched_tokens": 8},
        {"max_num_batched_tokens": 3},
        {"max_num_seqs": 1},
        {"max_num_seqs": 2, "max_num_batched_tokens": 5},
        {"block_size": 1},
        {"long_prefill_chunk": 3},
        {"long_prefill_chunk": 1, "max_num_batched_tokens": 8, "max_num_seqs": 3},
    ],
    ids=[
        "default", "chunked-8", "chunked-3", "one-seq", "two-seqs-chunked-5", "block-1",
        "long-prefill-3", "long-prefill-1-chunked-8",
    ],
)
def test_batch_gives_the_same_greedy_tokens_as_each_prompt_alone(
    make_llm: Callable[..., LLM], alone: list[list[int]], options: dict[str, Any]
) -> None:
    assert token_ids(make_llm(**options).generate(PROMPTS, GREEDY)) == alone


def test_tiny_cache_preempts_and_keeps_greedy_tokens(
    make_llm: Callable[..., LLM], alone: list[list[int]]
) -> None:
    # max_model_len 64 in blocks of 4 = 16 blocks: exactly one sequence's worth for six.
    llm = make_llm(block_size=4, num_blocks=16, max_model_len=64)
    outputs, preemptions = generate_counting_preemptions(llm, PROMPTS, GREEDY)
    assert preemptions > 0
    assert outputs == alone


def test_tiny_cache_with_chunked_prefill_and_seeded_sampling(
    make_llm: Callable[..., LLM],
) -> None:
    params = [seeded(seed) for seed in range(len(PROMPTS))]
    big = make_llm().generate(PROMPTS, params)
    llm = make_llm(block_size=4, num_blocks=16, max_model_len=64, max_num_batched_tokens=8)
    assert token_ids(llm.generate(PROMPTS, params)) == token_ids(big)


def test_greedy_rows_are_unaffected_by_sampled_neighbours(
    make_llm: Callable[..., LLM], alone: list[list[int]]
) -> None:
    params = [GREEDY if i % 2 == 0 else seeded(i) for i in range(len(PROMPTS))]
    outputs = make_llm().generate(PROMPTS, params)
    for i, out in enumerate(outputs):
        if i % 2 == 0:
            assert out.token_ids == alone[i]


def test_seeded_sampling_is_reproducible_across_calls(make_llm: Callable[..., LLM]) -> None:
    llm = make_llm()
    first = llm.generate(PROMPTS[0], seeded(7))[0].token_ids
    llm.generate(PROMPTS, SamplingParams(temperature=1.0))  # moves the shared generator
    assert llm.generate(PROMPTS[0], seeded(7))[0].token_ids == first


def test_seeded_sampling_ignores_batch_composition(make_llm: Callable[..., LLM]) -> None:
    target = PROMPTS[2]
    alone = make_llm().generate(target, seeded(42))[0].token_ids
    neighbours = [
        SamplingParams(temperature=1.0, max_tokens=5),  # unseeded: the shared generator
        GREEDY,
        seeded(3, max_tokens=20),
        SamplingParams(temperature=0.5, top_k=5, seed=9, max_tokens=3),
    ]
    batch = [PROMPTS[0], PROMPTS[1], target, PROMPTS[3], PROMPTS[4]]
    params = [neighbours[0], neighbours[1], seeded(42), neighbours[2], neighbours[3]]
    for options in ({}, {"max_num_batched_tokens": 8}, {"max_num_seqs": 2}):
        assert make_llm(**options).generate(batch, params)[2].token_ids == alone, options


def test_different_seeds_give_different_samples(
    make_llm: Callable[..., LLM], alone: list[list[int]]
) -> None:
    outputs = make_llm().generate([PROMPTS[0]] * 4, [seeded(s) for s in range(4)])
    samples = {tuple(o.token_ids) for o in outputs}
    assert len(samples) == 4
    assert tuple(alone[0][:12]) not in samples


def test_unseeded_sampling_follows_the_engine_seed(llama_checkpoint: Path) -> None:
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)

    def run(seed: int) -> list[list[int]]:
        return token_ids(LLM(model=str(llama_checkpoint), seed=seed).generate(PROMPTS, params))

    assert run(seed=5) == run(seed=5)
    assert run(seed=5) != run(seed=6)


def test_max_model_len_above_the_model_is_an_error(make_llm: Callable[..., LLM]) -> None:
    assert make_llm().engine.max_model_len == 256  # the checkpoint's max_position_embeddings
    assert make_llm(max_model_len=64).engine.max_model_len == 64
    with pytest.raises(ValueError, match=r"max_model_len=10000 is above what the model supports "
                       r"\(max_position_embeddings=256"):  # fmt: skip
        make_llm(max_model_len=10_000)


def test_context_limit_ends_generation_with_length(make_llm: Callable[..., LLM]) -> None:
    prompt = [0] + [5 + i % 300 for i in range(59)]  # 60 tokens, max_model_len 64
    out = make_llm(max_model_len=64).generate(prompt, GREEDY)[0]
    assert (len(out.token_ids), out.finish_reason) == (4, "length")


def test_step_reports_requests_that_got_a_token(make_llm: Callable[..., LLM]) -> None:
    engine = make_llm(max_num_batched_tokens=8).engine
    engine.step_times = StepTimes()  # the engine may be shared with other tests
    long = engine.add_request([0, *range(10, 30)], GREEDY)  # 21 tokens: 3 chunks of prefill
    short = engine.add_request([0, 5], SamplingParams(temperature=0.0, max_tokens=2))
    assert engine.step() == []  # long: 8 of 21
    assert engine.step() == []  # long: 16 of 21
    assert engine.step() == [long, short]  # long: last 5; short: its 2 prompt tokens
    assert engine.step() == [long, short]
    assert short.finished and short.finish_reason == "length"
    assert engine.scheduler.running == [long] and short.block_table.blocks == []
    while engine.has_unfinished():
        engine.step()
    out = engine.output(long)
    assert (len(out.token_ids), out.finish_reason) == (16, "length")
    times = engine.step_times
    assert times.steps == 4 + len(out.token_ids) - 2  # 3 prefill steps + one per later token
    assert set(times.seconds) == set(PHASES) and times.seconds["target"] > 0
    assert times.seconds["draft"] < times.seconds["target"]  # plain: the proposer is skipped
    assert sum(times.fractions().values()) == pytest.approx(1.0)
    # by kind: from step 4 on every step decodes one token a request; none verifies
    decode_steps, decode_s = times.kinds["decode"]
    assert decode_steps == len(out.token_ids) - 1 and 0 < decode_s <= times.seconds["target"]
    assert times.kinds["verify"] == [0, 0.0]


def test_steps_that_verify_drafts_are_timed_as_their_own_kind(llama_checkpoint: Path) -> None:
    from verispec import SpecConfig

    spec = SpecConfig(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1)
    llm = LLM(model=str(llama_checkpoint), speculative=spec)
    repeated = [0, *([5, 6, 7, 8, 9] * 6)]  # prompt lookup finds drafts at once
    out = llm.generate(repeated, GREEDY)[0]
    times, stats = llm.engine.step_times, llm.engine.spec_stats
    assert stats.num_verify_steps > 0 and times.kinds["verify"][0] == stats.num_verify_steps
    # tokens after the first: one per plain decode step, accepted + 1 per verify step
    decoded = times.kinds["decode"][0] + stats.num_verify_steps + stats.num_accepted_tokens
    assert decoded == len(out.token_ids) - 1
    assert times.kinds["verify"][1] > 0


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "256"])
def test_long_prefill_chunk_must_be_a_positive_integer_or_none(value: object) -> None:
    with pytest.raises(ValueError, match=r"long_prefill_chunk must be an integer >= 1 .* or None"):
        EngineConfig(long_prefill_chunk=value)  # type: ignore[arg-type]
    assert EngineConfig(long_prefill_chunk=None).long_prefill_chunk is None
