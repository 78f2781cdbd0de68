"""Greedy speculative decoding is lossless: token for token the target's own greedy output.

Every case runs in batch-invariant mode, where each row's logits are bit-for-bit what a lone
decode step computes, so equality (not similarity) with plain decoding is the contract
(docs/design.md, 3). Each case also checks that acceptance was partial, so drafts were really
rejected and rolled back, not all kept or all thrown away.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.checkpoints import CORPUS, SPEC_PAIRS, count_preemptions
from tests.helpers.drafting import (
    PROMPTS,
    assert_partial,
    assert_same,
    random_prompts,
    repeating_prompts,
    stop_params,
)
from verispec import LLM, SamplingParams, SpecConfig
from verispec.drafters.draft_model import DraftModelProposer
from verispec.drafters.ngram import Lookup
from verispec.engine.request import Request
from verispec.engine.runner import ModelRunner
from verispec.engine.step_drafts import StepDrafts
from verispec.models.kernels.build import NativeKernel, native_kernel
from verispec.types.outputs import RequestOutput

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
METHODS = ("draft_model", "ngram", "suffix")


pytestmark = pytest.mark.usefixtures("one_thread")


def spec_config(method: str, k: int, draft: Path) -> SpecConfig:
    if method == "draft_model":
        return SpecConfig(method=method, model=str(draft), num_speculative_tokens=k)
    if method == "suffix":
        return SpecConfig(method=method, num_speculative_tokens=k)
    return SpecConfig(method=method, num_speculative_tokens=k, prompt_lookup_min=1)


class Plain:
    """Plain greedy decoding of a target, one LLM per (target, engine settings), reused."""

    def __init__(self) -> None:
        self.llms: dict[tuple[str, tuple[tuple[str, Any], ...]], LLM] = {}

    def llm(self, target: Path, **engine: Any) -> LLM:
        key = (str(target), tuple(sorted(engine.items())))
        if key not in self.llms:
            self.llms[key] = LLM(model=str(target), batch_invariant=True, **engine)
        return self.llms[key]

    def generate(
        self, target: Path, prompts: list, params: Any, **engine: Any
    ) -> list[RequestOutput]:
        return self.llm(target, **engine).generate(prompts, params)


@pytest.fixture(scope="module")
def plain() -> Plain:
    return Plain()


def speculative(
    target: Path, draft: Path, method: str, k: int, prompts: list, params: Any, **engine: Any
) -> tuple[list[RequestOutput], LLM]:
    llm = LLM(
        model=str(target), batch_invariant=True, speculative=spec_config(method, k, draft), **engine
    )
    return llm.generate(prompts, params), llm


def pair_k_cases(subset: tuple[int, ...], llama: tuple[int, ...] = tuple(range(1, 9))) -> list[Any]:
    """Every k (by default) for the llama pair, a subset for the others (the pairs differ in
    the model, not in the speculative bookkeeping)."""
    cases = []
    for pair in SPEC_PAIRS:
        for k in llama if pair[0] == "llama" else subset:
            cases.append(pytest.param(pair, k, id=f"{pair[0]}-k{k}"))
    return cases


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("spec_pair", "k"), pair_k_cases((1, 3, 8)), indirect=["spec_pair"])
def test_greedy_equals_plain(spec_pair, k: int, method: str, plain: Plain) -> None:
    target, draft = spec_pair
    ref = plain.generate(target, PROMPTS, GREEDY)
    out, llm = speculative(target, draft, method, k, PROMPTS, GREEDY)
    assert_same(out, ref)
    assert_partial(llm)
    stats = llm.engine.spec_stats
    assert stats.num_draft_tokens <= k * stats.num_verify_steps
    assert len(stats.per_position_acceptance_rate) <= k


@pytest.mark.parametrize(("spec_pair", "k"), pair_k_cases((3,), llama=(2, 4)),
                         indirect=["spec_pair"])  # fmt: skip
def test_draft_model_copying_where_lookup_finds_equals_plain(spec_pair, k: int, plain: Plain,
                                                           monkeypatch) -> None:  # fmt: skip
    """Copy first (prompt_lookup_tokens on draft_model): requests whose context the lookup
    continues draft that copy, the others the draft model's chain, in the same batch; greedy
    output is plain decoding's, and both kinds of drafts were made."""
    target, draft = spec_pair
    made = {"copied": 0, "modelled": 0}
    chain, drafted = Lookup.chain, DraftModelProposer._draft

    def copy_spy(self: Lookup, request: Request, budget: int) -> list[int]:
        ids = chain(self, request, budget)
        made["copied"] += bool(ids)
        return ids

    def draft_spy(self: DraftModelProposer, requests: list, ks: list[int]) -> Any:
        made["modelled"] += len(requests)
        return drafted(self, requests, ks)

    monkeypatch.setattr(Lookup, "chain", copy_spy)
    monkeypatch.setattr(DraftModelProposer, "_draft", draft_spy)
    ref = plain.generate(target, PROMPTS, GREEDY)
    spec = SpecConfig(method="draft_model", model=str(draft), num_speculative_tokens=k,
                      prompt_lookup_tokens=k, prompt_lookup_min=1)  # fmt: skip
    llm = LLM(model=str(target), batch_invariant=True, speculative=spec)
    assert_same(llm.generate(PROMPTS, GREEDY), ref)
    assert_partial(llm)
    assert made["copied"] > 0 and made["modelled"] > 0


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    ("spec_pair", "k"), pair_k_cases((4,), llama=(1, 2, 5, 8)), indirect=["spec_pair"]
)
def test_stops_inside_an_accepted_run(
    spec_pair, k: int, method: str, plain: Plain, tokenizer, monkeypatch
) -> None:
    """EOS counts (no ignore_eos), stop ids and stop strings end the output exactly where plain
    decoding ends it, although the verifier handed over tokens past the stop."""
    target, draft = spec_pair
    ref = plain.generate(target, PROMPTS, GREEDY)
    params = stop_params(ref, lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    ref = plain.generate(target, PROMPTS, params)
    assert sum(r.finish_reason == "stop" for r in ref) >= len(ref) // 2

    dropped = []  # steps whose tokens ran past the stop, so the request dropped the rest
    append = Request.append_tokens

    def spy(self: Request, tokens: list[int], decode: Any, logprobs: Any = None) -> None:
        before = len(self.output_token_ids)
        append(self, tokens, decode, logprobs)
        if self.finished and len(self.output_token_ids) - before < len(tokens):
            dropped.append(tokens)

    monkeypatch.setattr(Request, "append_tokens", spy)
    out, _ = speculative(target, draft, method, k, PROMPTS, params)
    assert_same(out, ref)
    for o, p in zip(out, params, strict=True):
        if o.finish_reason == "stop" and p.stop_token_ids:
            assert o.token_ids[-1] in [*p.stop_token_ids, 1]  # 1: EOS
    if method == "draft_model":
        assert dropped, "no stop fell inside a multi-token step"


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    ("spec_pair", "k"),
    [pytest.param(SPEC_PAIRS[0], 4, id="llama-k4"), pytest.param(SPEC_PAIRS[1], 8, id="qwen2-k8")],
    indirect=["spec_pair"],
)
def test_context_limit(spec_pair, k: int, method: str, plain: Plain, monkeypatch) -> None:
    """Requests that run into max_model_len end with "length" at exactly that many tokens,
    and k shrinks so no draft is placed past it."""
    target, draft = spec_pair
    prompts = random_prompts(6, seed=2, lo=20, hi=46) + repeating_prompts(3)
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    ref = plain.generate(target, prompts, params, max_model_len=48)

    ends = []  # one past the last position each scheduled request computes
    execute = ModelRunner.execute

    def spy(self: ModelRunner, scheduled: list, drafts: StepDrafts, *rest: Any) -> tuple:
        ends.extend(s.start + len(s.token_ids) + len(ids)
                    for s, ids in zip(scheduled, drafts.token_ids, strict=True))
        return execute(self, scheduled, drafts, *rest)

    monkeypatch.setattr(ModelRunner, "execute", spy)
    out, llm = speculative(target, draft, method, k, prompts, params, max_model_len=48)
    assert_same(out, ref)
    assert max(ends) == 48
    for o in out:
        assert o.finish_reason == "length"
        assert len(o.prompt_token_ids) + len(o.token_ids) == 48
    assert llm.engine.spec_stats.num_verify_steps > 0


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("spec_pair", [SPEC_PAIRS[0]], indirect=True, ids=["llama"])
@pytest.mark.parametrize("k", [4, 8])
def test_max_tokens_limit(spec_pair, k: int, method: str, plain: Plain) -> None:
    """max_tokens smaller than, equal to and just above k + 1: exactly max_tokens tokens."""
    target, draft = spec_pair
    prompts = PROMPTS[:8]
    params = [
        SamplingParams(temperature=0, max_tokens=m, ignore_eos=True)
        for m in (1, 2, k, k + 1, k + 2, 2 * k + 3, 3, 7)
    ]
    ref = plain.generate(target, prompts, params)
    out, _ = speculative(target, draft, method, k, prompts, params)
    assert_same(out, ref)
    assert [len(o.token_ids) for o in out] == [p.max_tokens for p in params]


BATCHING = {
    "max_num_seqs=2": dict(max_num_seqs=2),
    "chunked_prefill": dict(max_num_batched_tokens=8),
    "both": dict(max_num_seqs=3, max_num_batched_tokens=8),
}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("engine", BATCHING.values(), ids=BATCHING.keys())
@pytest.mark.parametrize(
    ("spec_pair", "k"),
    [pytest.param(SPEC_PAIRS[0], 4, id="llama-k4"), pytest.param(SPEC_PAIRS[2], 6, id="qwen3-k6")],
    indirect=["spec_pair"],
)
def test_batch_compositions(spec_pair, k: int, method: str, engine: dict, plain: Plain) -> None:
    """Continuous batching (prefills of new requests beside verify steps of running ones) and
    chunked prefill (the token budget also caps k) give the same tokens."""
    target, draft = spec_pair
    prompts = [*random_prompts(4, seed=4, lo=6, hi=30), *repeating_prompts(5)[:2], CORPUS[1]]
    ref = plain.generate(target, prompts, GREEDY, **engine)
    out, llm = speculative(target, draft, method, k, prompts, GREEDY, **engine)
    assert_same(out, ref)
    assert_same(out, plain.generate(target, prompts, GREEDY))  # batch invariance itself
    assert_partial(llm)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    ("spec_pair", "k"),
    [pytest.param(SPEC_PAIRS[0], 4, id="llama-k4"), pytest.param(SPEC_PAIRS[1], 7, id="qwen2-k7")],
    indirect=["spec_pair"],
)
def test_preemption(spec_pair, k: int, method: str, plain: Plain, monkeypatch) -> None:
    """A cache that holds one full-length sequence: requests are preempted and recomputed
    (the draft model's cache state is dropped with them), and the tokens stay the same."""
    target, draft = spec_pair
    engine = dict(block_size=4, num_blocks=12, max_model_len=48)
    prompts = [*random_prompts(4, seed=6, lo=8, hi=20), *repeating_prompts(7)[2:4]]
    params = SamplingParams(temperature=0, max_tokens=26, ignore_eos=True)
    ref = plain.generate(target, prompts, params, **engine)

    preemptions = count_preemptions(monkeypatch)
    out, llm = speculative(target, draft, method, k, prompts, params, **engine)
    assert_same(out, ref)
    assert preemptions, "the cache was big enough; nothing was preempted"
    assert llm.engine.allocator.num_free == 12  # every block came back
    if method == "draft_model":
        assert llm.engine.proposer.allocator.num_used == 0 and not llm.engine.proposer.states
    if method == "suffix":  # preempted requests' tries were dropped, finished ones' too
        assert not llm.engine.proposer.requests


@pytest.mark.parametrize(
    ("quantization", "draft_quantization"),
    [("int8", None), ("fp16", "int8"), (None, "fp16"), (None, "auto"),
     pytest.param("w8a8", "w8a8", marks=pytest.mark.skipif(
         not isinstance(native_kernel(), NativeKernel), reason="w8a8 needs the native kernel"))],
)  # fmt: skip
@pytest.mark.parametrize("spec_pair", [SPEC_PAIRS[0]], indirect=True, ids=["llama"])
def test_quantized_pairs_equal_plain_decoding_of_the_quantized_target(
    spec_pair, quantization: str | None, draft_quantization: str | None, plain: Plain
) -> None:
    """Lossless with respect to the model that runs: a quantized target's speculative output is
    that quantized target's plain output; a quantized draft changes acceptance only."""
    target, draft = spec_pair
    ref = plain.generate(target, PROMPTS, GREEDY, quantization=quantization)
    spec = SpecConfig(
        method="draft_model", model=str(draft), num_speculative_tokens=4,
        quantization=draft_quantization,
    )  # fmt: skip
    llm = LLM(model=str(target), batch_invariant=True, speculative=spec, quantization=quantization)
    assert_same(llm.generate(PROMPTS, GREEDY), ref)
    assert_partial(llm)
