"""Bench engines: verispec and transformers give the same greedy ids and count acceptance."""

from __future__ import annotations

import pytest

from tests.helpers.checkpoints import SPEC_PAIRS
from verispec.bench.engines import (
    BatchRun,
    MethodSpec,
    RequestRun,
    Sampling,
    VerispecEngine,
    gaps,
)
from verispec.bench.hf_engine import TransformersEngine, hf_location
from verispec.bench.plan import chain_methods
from verispec.drafters.registry import PLAIN, takes_draft_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: a second thread only waits

ONE_PAIR = pytest.mark.parametrize("spec_pair", [SPEC_PAIRS[0]], indirect=True, ids=["llama"])
DRAFT_METHOD = next(m for m in chain_methods() if takes_draft_model(m))
LOOKUP_METHOD = next(m for m in chain_methods() if not takes_draft_model(m))
METHODS = [MethodSpec(), MethodSpec(DRAFT_METHOD, 3), MethodSpec(LOOKUP_METHOD, 3)]
# a prompt that repeats itself, so prompt lookup finds matches
PROMPTS = [[0, *range(10, 30), *range(10, 20)], [0, 5, 6, 7, 8, 5, 6, 7]]


@ONE_PAIR
@pytest.mark.parametrize("cls", [VerispecEngine, TransformersEngine])
def test_greedy_ids_and_acceptance(spec_pair, cls) -> None:
    target, draft = spec_pair
    sampling = Sampling(temperature=0.0, top_p=1.0, max_tokens=40)
    reference = VerispecEngine(target, None, MethodSpec(), "float32").run(PROMPTS, sampling, 1)
    expected = [r.token_ids for r in reference.requests]
    for spec in METHODS:
        engine = cls(target, draft, spec, "float32")
        run = engine.run(PROMPTS, sampling, concurrency=1)
        assert [r.token_ids for r in run.requests] == expected, (cls.engine, spec)
        assert run.num_tokens == sum(map(len, expected)) and run.tokens_per_s > 0
        for r in run.requests:
            assert r.ttft_s > 0 and len(r.itl_s) == len(r.token_ids) - 1
        stats = run.spec_stats()
        if spec.method == PLAIN:
            assert stats.num_draft_tokens == 0
        else:  # the greedy outputs of this pair fall into loops that prompt lookup finds
            assert stats.num_verify_steps > 0, (cls.engine, spec, expected)
            assert stats.num_draft_tokens <= spec.k * stats.num_verify_steps
            assert 0 <= stats.num_accepted_tokens <= stats.num_draft_tokens
            if spec.method == DRAFT_METHOD:  # the draft is a perturbed copy: it agrees often
                assert stats.num_accepted_tokens > 0


@ONE_PAIR
def test_sampled_runs_are_seeded_and_concurrency_batches(spec_pair) -> None:
    target, draft = spec_pair
    sampling = Sampling(temperature=1.0, top_p=0.9, max_tokens=8, seed=3)
    engine = VerispecEngine(target, draft, MethodSpec(DRAFT_METHOD, 2), "float32")
    a = engine.run(PROMPTS, sampling, concurrency=2)
    b = engine.run(PROMPTS, sampling, concurrency=1)
    assert [r.token_ids for r in a.requests] == [r.token_ids for r in b.requests]
    with pytest.raises(ValueError, match="one prompt at a time"):
        TransformersEngine(target, draft, MethodSpec(), "float32").run(PROMPTS, sampling, 2)


def test_gaps_share_a_step_time() -> None:
    assert gaps([(1.0, 1), (1.5, 3)]) == [0.5, 0.0, 0.0]
    assert gaps([(2.0, 2)]) == [0.0]


def test_tpot_leaves_the_first_token_out() -> None:
    # 4 tokens: first after 0.5 s, then a step of two tokens (0.03, 0) and one of 0.03 s:
    # 0.06 s over 3 later tokens. A one-token request has no TPOT and is left out of the mean.
    fast = RequestRun([1, 2, 3, 4], 0.5, [0.03, 0.0, 0.03])
    slow = RequestRun([1, 2, 3], 0.1, [0.04, 0.04])
    assert fast.tpot_s == pytest.approx(0.02) and slow.tpot_s == pytest.approx(0.04)
    assert RequestRun([1], 0.5, []).tpot_s is None
    run = BatchRun([fast, slow, RequestRun([1], 0.5, [])], wall_s=1.0)
    assert run.tpot_s == pytest.approx(0.03) and BatchRun([], 1.0).tpot_s is None


def test_hf_location_of_a_gguf_file(tmp_path) -> None:
    assert hf_location(tmp_path / "m.gguf") == (str(tmp_path), {"gguf_file": "m.gguf"})
    assert hf_location(tmp_path) == (str(tmp_path), {})
