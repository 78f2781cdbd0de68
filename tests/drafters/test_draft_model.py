"""The draft-model proposer end to end: KV caches after rollback, seeds, vocabularies, a draft
with a shorter context than the target, and the acceptance statistics it produces."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from tests.helpers.checkpoints import CORPUS, SPEC_PAIRS, make_checkpoint
from tests.helpers.drafting import check_caches, small_vocab_sample
from verispec import LLM, SamplingParams, SpecConfig
from verispec.drafters.draft_model import check_vocabularies
from verispec.engine.request import Request
from verispec.models.kernels.native_layer import can_step_greedily
from verispec.tokenizer import Tokenizer
from verispec.train.tokenizer import save_tokenizer, train_bpe_tokenizer
from verispec.types.stats import SpecStats

LLAMA = pytest.mark.parametrize("spec_pair", [SPEC_PAIRS[0]], indirect=True, ids=["llama"])
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
SPEC_FIELDS = {
    "num_verify_steps", "num_draft_tokens", "num_accepted_tokens", "acceptance_rate",
    "mean_acceptance_length", "per_position_acceptance_rate",
}  # fmt: skip


pytestmark = pytest.mark.usefixtures("one_thread")


def random_prompts(n: int, seed: int, lo: int = 3, hi: int = 20) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [[0, *torch.randint(3, 320, (m,), generator=g).tolist()] for m in lengths]


def draft_llm(
    target: Path, draft: Path, k: int = 4, draft_vocab_size: int | None = None, **engine: Any
) -> LLM:
    spec = SpecConfig(method="draft_model", model=str(draft), num_speculative_tokens=k,
                      draft_vocab_size=draft_vocab_size)  # fmt: skip
    return LLM(model=str(target), speculative=spec, **engine)


REDUCED = 270
"""A reduced draft vocabulary of the 320-token pairs: their 259 special and byte tokens and the
11 most frequent merges; the targets' greedy outputs hold many of the 50 left out."""


@pytest.fixture
def vocab_sample(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small_vocab_sample(monkeypatch, tmp_path / "cache")


# KV caches after rollback


KV_CASES = {
    "greedy": (SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), {}),
    "sampled": (  # 32 tokens: the close draft must be rejected somewhere (9 times here)
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=32, ignore_eos=True, seed=3),
        {},
    ),
    "greedy-chunked-two-seqs": (
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
        dict(max_num_seqs=2, max_num_batched_tokens=8),
    ),
    "sampled-preempted": (
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=32, ignore_eos=True),
        dict(block_size=4, num_blocks=10, max_model_len=40, seed=1),  # 7 rollbacks here
    ),
}


@LLAMA
@pytest.mark.parametrize("case", KV_CASES.values(), ids=KV_CASES.keys())
def test_kv_caches_match_a_fresh_prefill_after_every_step(spec_pair, case: tuple) -> None:
    target, draft = spec_pair
    params, engine_options = case
    llm = draft_llm(target, draft, k=5, **engine_options)
    engine = llm.engine
    requests = [engine.add_request(p, params) for p in random_prompts(4, seed=8)]
    stale = steps = 0
    while engine.has_unfinished():
        engine.step()
        stale += check_caches(engine, requests)
        steps += 1
    assert stale > 0, "no draft was ever rejected, so no rollback was checked"
    stats = engine.spec_stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert not engine.proposer.states
    assert engine.proposer.allocator.num_used == 0 and engine.allocator.num_used == 0


@LLAMA
@pytest.mark.parametrize("draft_vocab_size", [None, REDUCED], ids=["whole", "reduced"])
@pytest.mark.usefixtures("vocab_sample")
def test_greedy_steps_in_one_call_draft_what_the_loop_drafts(
    spec_pair, monkeypatch, draft_vocab_size: int | None
) -> None:
    """Greedy requests take every draft step after the first in one native call
    (native_layer.greedy_steps): the drafts of each step, the output and the acceptance are
    those of the loop of forwards, and the KV cache checks above hold after every step; with a
    reduced head too (its argmax row mapped to a token id before it is fed back)."""
    target, draft = spec_pair
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)

    kept: list[int] = []  # the reduced head's ids

    def run(one_call: bool) -> tuple[list, list, int, int]:
        llm = draft_llm(target, draft, k=5, draft_vocab_size=draft_vocab_size, max_num_seqs=2)
        proposer = llm.engine.proposer
        assert can_step_greedily(proposer.model), "the tiny draft runs the native stack"
        if proposer.model.vocab_ids is not None:
            kept[:] = proposer.model.vocab_ids.tolist()
        drafted: list[list[list[int]]] = []
        taken = [0]
        propose, step_greedily = proposer.propose, proposer._step_greedily

        def spy_propose(requests, num_tokens):
            drafts = propose(requests, num_tokens)
            drafted.append(drafts.token_ids)
            return drafts

        def spy_steps(*args) -> bool:
            took = step_greedily(*args)
            taken[0] += took
            return took

        monkeypatch.setattr(proposer, "propose", spy_propose)
        monkeypatch.setattr(proposer, "_step_greedily", spy_steps if one_call else
                            lambda *args: False)  # fmt: skip
        engine = llm.engine
        requests = [engine.add_request(p, params) for p in random_prompts(3, seed=4)]
        while engine.has_unfinished():
            engine.step()
            check_caches(engine, requests)
        ids = [r.output_token_ids for r in requests]
        return drafted, ids, engine.spec_stats.num_accepted_tokens, taken[0]

    one_call, loop = run(True), run(False)
    assert one_call[3] > 0, "the one-call path never ran"
    assert one_call[:3] == loop[:3]
    if draft_vocab_size is not None:  # drafts come from the kept ids only, some beyond row 270
        drafted = {t for step in one_call[0] for d in step for t in d}
        assert len(kept) == draft_vocab_size
        assert drafted <= set(kept) and max(drafted) >= draft_vocab_size


# A reduced draft vocabulary


@pytest.mark.usefixtures("vocab_sample")
def test_reduced_vocabulary_keeps_greedy_output(spec_pair) -> None:
    """The draft's head keeps REDUCED rows (its embedding all 320: it reads any token) and
    drafts only those ids; the target's greedy tokens outside them are always rejected drafts,
    recovered by the verifier, so the output is still plain decoding's (tied embeddings in the
    qwen2 pair)."""
    target, draft = spec_pair
    prompts = [*random_prompts(4, seed=15), *CORPUS[:2]]
    ref = LLM(model=str(target), batch_invariant=True).generate(prompts, GREEDY)
    llm = draft_llm(target, draft, draft_vocab_size=REDUCED, batch_invariant=True)
    model = llm.engine.proposer.model
    assert model.lm_head.out_features == REDUCED and model.embed.shape[0] == 320
    ids = set(model.vocab_ids.tolist())
    outside = [t for r in ref for t in r.token_ids if t not in ids]
    assert len(outside) >= 5, "the target never needs a token the draft lacks"
    out = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in out] == [r.token_ids for r in ref]
    stats = llm.engine.spec_stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens


@LLAMA
@pytest.mark.usefixtures("vocab_sample")
@pytest.mark.parametrize(
    ("size", "message"),
    [(321, "draft_vocab_size must be at most 320"),
     (100, "draft_vocab_size must be at least 259: the special, chat-template and byte tokens")],
)  # fmt: skip
def test_reduced_vocabulary_out_of_range_is_refused_at_load(
    spec_pair, size: int, message: str
) -> None:
    target, draft = spec_pair
    with pytest.raises(ValueError, match=message):
        draft_llm(target, draft, draft_vocab_size=size)


# Seeds


SAMPLED = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=24, ignore_eos=True)


def seeded(seed: int) -> SamplingParams:
    return SamplingParams(temperature=0.8, top_p=0.9, max_tokens=24, ignore_eos=True, seed=seed)


def spec_for(method: str, draft: Path) -> SpecConfig:
    if method == "draft_model":
        return SpecConfig(method=method, model=str(draft), num_speculative_tokens=4)
    return SpecConfig(method=method, num_speculative_tokens=4, prompt_lookup_min=1)


@LLAMA
@pytest.mark.parametrize("method", ["draft_model", "ngram"])
@pytest.mark.parametrize("batch_invariant", [False, True])
def test_same_seed_same_tokens_in_fresh_instances(
    spec_pair, method: str, batch_invariant: bool
) -> None:
    target, draft = spec_pair
    prompts = [*random_prompts(3, seed=9), CORPUS[3]]
    params = [seeded(s) for s in (11, 12, 13, 11)]
    runs = []
    for _ in range(2):
        llm = LLM(model=str(target), speculative=spec_for(method, draft),
                  batch_invariant=batch_invariant)  # fmt: skip
        runs.append([o.token_ids for o in llm.generate(prompts, params)])
    assert runs[0] == runs[1]
    greedy = LLM(model=str(target), batch_invariant=batch_invariant).generate(
        prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    )
    assert any(o.token_ids != r for o, r in zip(greedy, runs[0], strict=True)), "not sampling"


@LLAMA
@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_seeded_requests_ignore_their_batch_mates(spec_pair, method: str) -> None:
    """A seeded request gets the same tokens alone, beside unseeded sampled and greedy
    requests, and with a smaller max_num_seqs (batch-invariant mode, so logits agree too)."""
    target, draft = spec_pair
    mine = random_prompts(2, seed=10)
    others = [*random_prompts(3, seed=11), CORPUS[0]]
    mine_params = [seeded(21), seeded(22)]

    def run(prompts: list, params: list, **engine: Any) -> list[list[int]]:
        llm = LLM(model=str(target), speculative=spec_for(method, draft), batch_invariant=True,
                  seed=engine.pop("seed", 0), **engine)  # fmt: skip
        return [o.token_ids for o in llm.generate(prompts, params)]

    alone = run(mine, mine_params)
    other_params = [SAMPLED, GREEDY, SAMPLED, seeded(5)]
    mixed = run([others[0], mine[0], others[1], others[2], mine[1], others[3]],
                [other_params[0], mine_params[0], other_params[1], other_params[2],
                 mine_params[1], other_params[3]], seed=7)  # fmt: skip
    assert [mixed[1], mixed[4]] == alone
    two_at_a_time = run(
        [mine[1], *others, mine[0]], [mine_params[1], *other_params, mine_params[0]], max_num_seqs=2
    )
    assert [two_at_a_time[-1], two_at_a_time[0]] == alone


@LLAMA
@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_a_seed_fixes_the_output_whatever_k(spec_pair, method: str) -> None:
    """Seeded requests get plain seeded decoding's tokens (k = 0) with any fixed k from 1 to 4
    and under the adaptive policy: each token is drawn with the noise of its own position, and
    drafts only decide how many tokens a step emits (docs/design.md, 3). Batch-invariant, so
    verify rows are the decode steps' logits bit for bit."""
    target, draft = spec_pair
    prompts = [*random_prompts(3, seed=16), CORPUS[2], [0, 5, 6, 5, 6, 5, 6]]
    params = [seeded(30 + i) for i in range(len(prompts))]

    def run(spec: SpecConfig | None) -> tuple[list[list[int]], SpecStats]:
        llm = LLM(model=str(target), speculative=spec, batch_invariant=True)
        return [o.token_ids for o in llm.generate(prompts, params)], llm.engine.spec_stats

    plain, _ = run(None)
    greedy = LLM(model=str(target), batch_invariant=True).generate(prompts, GREEDY)
    assert [o.token_ids for o in greedy] != plain, "not sampling"
    specs = [replace(spec_for(method, draft), num_speculative_tokens=k) for k in (1, 2, 3, 4)]
    for spec in [*specs, replace(spec_for(method, draft), adaptive=True)]:
        tokens, stats = run(spec)
        assert tokens == plain, spec
        assert stats.num_draft_tokens > stats.num_accepted_tokens  # some drafts were rejected
        assert method == "ngram" or stats.num_accepted_tokens > 0


@LLAMA
def test_a_sampling_drafter_races_with_the_verifiers_noise(spec_pair) -> None:
    """A draft model that is the target itself drafts argmax(q / E) with q = p and the very
    noise the verifier races p with at that position, so a seeded request at temperature 1
    has every draft accepted (with noise of its own it would agree about sum p^2 of the time)."""
    target, _ = spec_pair
    spec = SpecConfig(method="draft_model", model=str(target), num_speculative_tokens=3)
    llm = LLM(model=str(target), speculative=spec, batch_invariant=True)
    params = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=4)
    llm.generate(random_prompts(4, seed=17), params)
    stats = llm.engine.spec_stats
    assert stats.num_draft_tokens > 0 and stats.acceptance_rate == 1.0


# Vocabularies


@LLAMA
def test_identical_vocabularies_pass(spec_pair) -> None:
    target, draft = spec_pair
    check_vocabularies(Tokenizer(target), Tokenizer(draft))


def save_padded_draft(draft: Path, out: Path, extra: int) -> None:
    """The draft with `extra` padding rows at the end of its embedding and head; the head's
    padding rows score far above every real token, so a draft that looked at them would
    propose ids the target does not have."""
    model = AutoModelForCausalLM.from_pretrained(str(draft)).eval()
    vocab = model.config.vocab_size
    model.resize_token_embeddings(vocab + extra)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head[vocab:] = 50 * head[:extra]
    model.save_pretrained(str(out))
    GenerationConfig(bos_token_id=0, eos_token_id=1, pad_token_id=2).save_pretrained(str(out))
    save_tokenizer(train_bpe_tokenizer(CORPUS, vocab_size=vocab), out)


@LLAMA
def test_draft_with_padded_vocabulary(spec_pair, tmp_path: Path) -> None:
    target, draft = spec_pair
    padded = tmp_path / "padded"
    save_padded_draft(draft, padded, extra=16)
    assert json.loads((padded / "config.json").read_text())["vocab_size"] == 320 + 16
    check_vocabularies(Tokenizer(target), Tokenizer(padded))
    prompts = [*random_prompts(4, seed=12), *CORPUS[:2]]
    ref = LLM(model=str(target), batch_invariant=True).generate(prompts, GREEDY)
    padded_llm = draft_llm(target, padded, batch_invariant=True)
    out = padded_llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in out] == [r.token_ids for r in ref]
    same_llm = draft_llm(target, draft, batch_invariant=True)
    same_llm.generate(prompts, GREEDY)  # the unpadded draft proposes exactly the same tokens
    assert padded_llm.engine.spec_stats == same_llm.engine.spec_stats
    assert 0 < padded_llm.engine.spec_stats.num_accepted_tokens


@LLAMA
def test_draft_with_another_tokenizer_is_refused(spec_pair, tmp_path: Path, tokenizer) -> None:
    target, _ = spec_pair
    texts = ["zebra quokka xylophone jazz " * 4, "Mississippi bookkeeper 12345\n" * 3]
    other = train_bpe_tokenizer(texts, vocab_size=320)
    make_checkpoint(tmp_path, "llama", other)
    mine = {i: t for t, i in tokenizer.get_vocab().items()}
    theirs = {i: t for t, i in other.get_vocab().items()}
    first = next(i for i in range(320) if mine.get(i) != theirs.get(i))
    with pytest.raises(ValueError, match=f"differs from the target's at id {first}:") as info:
        draft_llm(target, tmp_path)
    assert repr(mine[first]) in str(info.value) and repr(theirs[first]) in str(info.value)


# A draft with a shorter context


@LLAMA
def test_draft_with_shorter_context(spec_pair, tmp_path: Path, monkeypatch) -> None:
    """A draft that knows 32 positions drafts while the request is shorter, then k shrinks to 0
    and the target decodes alone; the output is still the target's own."""
    target, draft = spec_pair
    short = tmp_path / "short"
    short.mkdir()
    for f in draft.iterdir():
        (short / f.name).write_bytes(f.read_bytes())
    config = json.loads((short / "config.json").read_text())
    config["max_position_embeddings"] = 32
    (short / "config.json").write_text(json.dumps(config))
    prompts = random_prompts(4, seed=13, lo=10, hi=20)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    ref = LLM(model=str(target), batch_invariant=True).generate(prompts, params)
    llm = draft_llm(target, short, k=6, batch_invariant=True)
    proposer = llm.engine.proposer
    assert proposer.max_len == 32
    seen: list[tuple[int, int]] = []  # (tokens before the drafts, drafts)
    propose = proposer.propose

    def spy(requests: list[Request], num_tokens: list[int]) -> Any:
        drafts = propose(requests, num_tokens)
        seen.extend((r.num_tokens, len(d)) for r, d in zip(requests, drafts.token_ids, strict=True))
        return drafts

    monkeypatch.setattr(proposer, "propose", spy)
    out = llm.generate(prompts, params)
    assert [o.token_ids for o in out] == [r.token_ids for r in ref]
    assert all(n + d <= 32 for n, d in seen if d), "a draft position past the draft's context"
    assert any(d for _, d in seen) and any(n >= 32 and d == 0 for n, d in seen)
    assert all(len(o.prompt_token_ids) + len(o.token_ids) > 32 for o in out)


# Statistics


def assert_consistent(spec: SpecStats, d: dict, k: int) -> None:
    assert set(d) >= SPEC_FIELDS
    steps, drafts, accepted = d["num_verify_steps"], d["num_draft_tokens"], d["num_accepted_tokens"]
    assert (steps, drafts, accepted) == (
        spec.num_verify_steps, spec.num_draft_tokens, spec.num_accepted_tokens
    )  # fmt: skip
    assert 0 <= accepted <= drafts <= k * steps
    if steps == 0:  # nothing was ever drafted (an n-gram that never matched)
        assert d["acceptance_rate"] is None and d["mean_acceptance_length"] is None
        assert d["per_position_acceptance_rate"] == []
        return
    assert steps <= drafts
    assert d["acceptance_rate"] == pytest.approx(accepted / drafts)
    assert d["mean_acceptance_length"] == pytest.approx(1 + accepted / steps)
    rates = d["per_position_acceptance_rate"]
    assert len(rates) <= k
    assert all(1 >= a >= b >= 0 for a, b in itertools.pairwise(rates))
    assert sum(rates) * steps == pytest.approx(accepted)


@LLAMA
@pytest.mark.parametrize("method", ["draft_model", "ngram"])
@pytest.mark.parametrize(
    "params", [GREEDY, SamplingParams(temperature=0.05, max_tokens=24, ignore_eos=True, seed=3)],
    ids=["greedy", "sampled"],
)  # fmt: skip
def test_stats_are_consistent(spec_pair, method: str, params: SamplingParams) -> None:
    """Per-request counters agree with their derived rates and sum to the engine's. (The tiny
    target's logits are flat: at temperature >= 0.5 nearly every draft is accepted, so the
    sampled case runs cold enough for rejections; with seed 3 prompt lookup also has some of
    its few drafts accepted.)"""
    target, draft = spec_pair
    llm = LLM(model=str(target), speculative=spec_for(method, draft))
    prompts = [*random_prompts(4, seed=14), CORPUS[3], [0, 5, 6, 5, 6, 5, 6]]
    outs = llm.generate(prompts, params)
    total = SpecStats()
    for o in outs:
        m = o.metrics
        spec = m.spec
        assert m.acceptance_rate == spec.acceptance_rate
        assert m.mean_acceptance_length == spec.mean_acceptance_length
        assert_consistent(spec, m.to_dict(), k=4)
        # each step emits its accepted drafts plus one token, and none is cut (no stops)
        assert m.num_output_tokens >= spec.num_verify_steps + spec.num_accepted_tokens
        total.merge(spec)
    assert sum(o.metrics.spec.num_verify_steps > 0 for o in outs) >= len(outs) // 2
    engine_stats = llm.engine.spec_stats
    assert engine_stats == total
    assert_consistent(engine_stats, engine_stats.to_dict(), k=4)
    assert 0 < engine_stats.acceptance_rate < 1


@LLAMA
def test_plain_decoding_has_no_speculation_stats(spec_pair) -> None:
    target, _ = spec_pair
    llm = LLM(model=str(target))
    (out,) = llm.generate(CORPUS[0], GREEDY)
    d = out.metrics.to_dict()
    assert set(d) >= SPEC_FIELDS
    assert (d["num_verify_steps"], d["num_draft_tokens"], d["num_accepted_tokens"]) == (0, 0, 0)
    assert d["acceptance_rate"] is None and d["mean_acceptance_length"] is None
    assert d["per_position_acceptance_rate"] == []
    assert out.metrics.acceptance_rate is None and out.metrics.mean_acceptance_length is None
    assert llm.engine.spec_stats == SpecStats()


def test_draft_with_too_few_embedding_rows_is_refused_at_load(
    llama_checkpoint: Path, tokenizer, tmp_path: Path
) -> None:
    """Its tokenizer maps every token as the target's does, but ids past its last embedding row
    would crash the first forward that meets them: refused when the engine starts."""
    short = tmp_path / "short-draft"
    make_checkpoint(short, "llama", tokenizer, vocab_size=len(tokenizer) - 20)
    spec = SpecConfig(method="draft_model", model=str(short))
    with pytest.raises(ValueError, match=f"has {len(tokenizer) - 20} embedding rows but the "
                       f"tokenizer and target use {len(tokenizer)} token ids"):  # fmt: skip
        LLM(model=str(llama_checkpoint), speculative=spec)
