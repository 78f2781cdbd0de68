"""Self-speculation (method "self"): the target drafts with some of its own layers skipped.

Lossless like every method (greedy equality with plain decoding in batch-invariant mode, the
sampling distribution test), with no weights of its own (the draft's tensors are the target's),
a KV cache of its own that matches a fresh prefill of the kept layers after every step, and a
calibration that is deterministic and returns a usable skip set.

The targets are tiny 4-layer models whose layers 1 and 2 write little into the residual stream
(their output projections scaled by WEAK), so skipping them gives partial acceptance (about 0.5
at k = 3) rather than none, as a random model's equally strong layers would.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from tests.helpers.checkpoints import CORPUS, count_preemptions, family_config, make_checkpoint
from tests.helpers.distribution import (
    ALPHA,
    DRAFT_PROMPT,
    TOKENS,
    VOCAB,
    exact_joint,
    run_case,
    word_tokenizer,
)
from tests.helpers.drafting import (
    PROMPTS,
    assert_partial,
    assert_same,
    check_caches,
    random_prompts,
    repeating_prompts,
    stop_params,
)
from verispec import LLM, SamplingParams, SpecConfig
from verispec.audit.fit import fit
from verispec.drafters.registry import check_spec
from verispec.drafters.self_draft import CALIBRATION_PROMPTS, SelfDraftProposer
from verispec.drafters.skip_search import SkipChoice, calibrate, mean_accepted
from verispec.types.outputs import RequestOutput

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
WEAK = 0.15  # scale of layers 1 and 2's output projections
SKIP = (1, 2)

pytestmark = pytest.mark.usefixtures("one_thread")


def weaken(model: PreTrainedModel, layers: tuple[int, ...], scale: float) -> None:
    """Scale the attention and MLP output projections of `layers` in place."""
    with torch.no_grad():
        for i in layers:
            model.model.layers[i].self_attn.o_proj.weight.mul_(scale)
            model.model.layers[i].mlp.down_proj.weight.mul_(scale)


def make_target(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any, family: str) -> Path:
    path = tmp_path_factory.mktemp(f"self-{family}")
    model = make_checkpoint(path, family, tokenizer, layer_scale=8.0, num_hidden_layers=4)
    weaken(model, SKIP, WEAK)
    model.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module", params=["llama", "mistral", "qwen3"])
def family_target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                  tokenizer) -> Path:  # fmt: skip
    """A 4-layer target of each family (mistral: sliding windows; qwen3: q/k norms)."""
    return make_target(tmp_path_factory, tokenizer, request.param)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> Path:
    """The 4-layer Llama target, for the engine's bookkeeping (the same for every family)."""
    return make_target(tmp_path_factory, tokenizer, "llama")


@pytest.fixture(scope="module")
def plain() -> dict[tuple, list[RequestOutput]]:
    """Plain greedy outputs, cached per (target, prompts, params, engine settings)."""
    return {}


def plain_generate(cache: dict, target: Path, prompts: list, params: Any, **engine: Any) -> list:
    key = (str(target), repr(prompts), repr(params), repr(sorted(engine.items())))
    if key not in cache:
        llm = LLM(model=str(target), batch_invariant=True, speculative=None, **engine)
        cache[key] = llm.generate(prompts, params)
    return cache[key]


def self_llm(target: Path, k: int, skip: tuple[int, ...] | None = SKIP, **engine: Any) -> LLM:
    spec = SpecConfig(method="self", self_skip_layers=skip, num_speculative_tokens=k)
    return LLM(model=str(target), batch_invariant=True, speculative=spec, **engine)


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_equals_plain(family_target: Path, k: int, plain: dict) -> None:
    target = family_target
    ref = plain_generate(plain, target, PROMPTS, GREEDY)
    llm = self_llm(target, k)
    assert_same(llm.generate(PROMPTS, GREEDY), ref)
    assert_partial(llm)
    stats = llm.engine.spec_stats
    assert stats.num_draft_tokens <= k * stats.num_verify_steps


@pytest.mark.parametrize("skip", [(0,), (3,), (0, 1, 3)], ids=str)
def test_any_skip_set_is_lossless(family_target: Path, skip: tuple[int, ...], plain: dict) -> None:
    """First, last and several layers skipped: acceptance changes, the output does not."""
    ref = plain_generate(plain, family_target, PROMPTS, GREEDY)
    assert_same(self_llm(family_target, 4, skip).generate(PROMPTS, GREEDY), ref)


def test_kv_caches_match_a_fresh_prefill_after_every_step(family_target: Path) -> None:
    """The draft's own cache (kept layers only) equals a fresh prefill of the view model at
    every valid position after each step, sampled requests included; the target's likewise."""
    llm = self_llm(family_target, 3, max_num_seqs=2, max_num_batched_tokens=8)
    engine = llm.engine
    # 48 tokens at T = 1: a skip-set draft this close must be rejected somewhere (5 times in
    # each family here; at T = 0.8 and 20 tokens qwen3's draft never was)
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=48, ignore_eos=True, seed=3)
    requests = [engine.add_request(p, params) for p in PROMPTS[:4]]
    stale = 0
    while engine.has_unfinished():
        engine.step()
        stale += check_caches(engine, requests)
    assert stale > 0  # rejected drafts were held and rolled back
    assert engine.spec_stats.num_accepted_tokens > 0


ENGINES = {
    "batching": dict(max_num_seqs=3, max_num_batched_tokens=8),
    "preemption": dict(block_size=4, num_blocks=12, max_model_len=48),
    "prefix-cache": dict(enable_prefix_caching=True),
}


@pytest.mark.parametrize("engine", ENGINES.values(), ids=ENGINES.keys())
def test_engine_settings_keep_the_tokens(
    target: Path, engine: dict, plain: dict, monkeypatch
) -> None:
    """Continuous batching with chunked prefill, preemption (the draft state of a preempted
    request is dropped and rebuilt) and prefix caching give plain decoding's tokens."""
    prompts = [*random_prompts(4, seed=6, lo=8, hi=20), *repeating_prompts(7)[2:4]]
    params = SamplingParams(temperature=0, max_tokens=26, ignore_eos=True)
    ref = plain_generate(plain, target, prompts, params, **engine)
    preemptions = count_preemptions(monkeypatch)
    llm = self_llm(target, 4, **engine)
    assert_same(llm.generate(prompts + prompts[:2], params), ref + ref[:2])
    assert_partial(llm)
    if "num_blocks" in engine:
        assert preemptions, "the cache was big enough; nothing was preempted"
    proposer = llm.engine.proposer
    assert proposer.allocator.num_used == 0 and not proposer.states


def test_stops_and_limits(target: Path, plain: dict, tokenizer) -> None:
    """Stop ids and strings inside an accepted run, and max_tokens around k + 1."""
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    params = stop_params(plain_generate(plain, target, PROMPTS, GREEDY), decode)
    params += [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (1, 4, 5)]
    prompts = PROMPTS + PROMPTS[:3]
    out = self_llm(target, 4).generate(prompts, params)
    assert_same(out, plain_generate(plain, target, prompts, params))


def test_the_draft_shares_the_targets_weights(target: Path) -> None:
    """No parameter memory of its own: every tensor the draft reads is one of the target's
    (same storage), its layers are the target's kept layers in order, and its KV cache has
    one layer per kept layer."""
    llm = self_llm(target, 4, skip=(0, 2), linear_backend="torch")  # weights as plain tensors
    model, proposer = llm.engine.model, llm.engine.proposer
    assert isinstance(proposer, SelfDraftProposer)
    draft = proposer.model
    assert [id(layer) for layer in draft.layers] == [id(model.layers[1]), id(model.layers[3])]
    assert draft.config.num_layers == 2 and model.config.num_layers == 4
    assert len(proposer.paged.kv.k) == 2

    def pointers(m: Any) -> set[int]:
        tensors = [m.embed, m.final_norm, m.lm_head.weight]
        for layer in m.layers:
            tensors += [layer.input_norm, layer.post_norm, layer.qkv.weight, layer.o.weight,
                        layer.gate_up.weight, layer.down.weight]  # fmt: skip
        return {t.data_ptr() for t in tensors}

    assert pointers(draft) <= pointers(model)
    assert draft.embed.data_ptr() == model.embed.data_ptr()
    assert draft.layers[0].qkv.weight.data_ptr() == model.layers[1].qkv.weight.data_ptr()


def test_calibration_is_deterministic_and_valid(target: Path, tmp_path: Path) -> None:
    llm = LLM(model=str(target), speculative=None)
    model = llm.engine.model
    prompts = [llm.engine.tokenizer.encode(t) for t in (*CALIBRATION_PROMPTS, *CORPUS[:2])]
    first, scored = calibrate(model, prompts, {1}, max_k=6, num_tokens=24)
    again, scored_again = calibrate(model, prompts, {1}, max_k=6, num_tokens=24)
    assert first == again and scored == scored_again
    assert first.skip_layers and 0 < len(first.skip_layers) < 4
    assert all(0 <= i < 4 for i in first.skip_layers)
    assert first.num_layers == 4 and 1 <= (first.num_speculative_tokens or 0) <= 6
    assert first.expected_speedup == max(c.speedup for c in scored)
    assert {c.search for c in scored} == {"early exit", "interleaved"}
    by_skip = {c.skip: c for c in scored}
    assert {(1,), (2,), (1, 2, 3), (3,)} <= by_skip.keys()
    assert by_skip[(1,)].agreement > by_skip[(0,)].agreement  # the weak layer matters less
    first.save(tmp_path / "c.json")
    assert SkipChoice.load(tmp_path / "c.json") == first


def test_calibration_at_load_is_stored_and_reused(
    target: Path, tmp_path: Path, plain: dict, capsys
) -> None:
    """No skip set: the engine calibrates (k at most num_speculative_tokens), says what it
    chose, stores it in the file, and the next engine reads it instead of calibrating."""
    path = tmp_path / "self.json"
    spec = SpecConfig(method="self", num_speculative_tokens=5, self_calibration=str(path))
    llm = LLM(model=str(target), batch_invariant=True, speculative=spec)
    err = capsys.readouterr().err
    assert "calibrating" in err and "self-speculation drafts with" in err
    choice = llm.engine.proposer.choice
    assert SkipChoice.load(path) == choice and json.loads(path.read_text())["num_layers"] == 4
    assert 1 <= choice.num_speculative_tokens <= 5
    assert llm.engine.proposer.depth == choice.num_speculative_tokens
    assert_same(llm.generate(PROMPTS, GREEDY), plain_generate(plain, target, PROMPTS, GREEDY))
    again = LLM(model=str(target), speculative=dataclasses.replace(spec))
    err = capsys.readouterr().err
    assert "calibrating" not in err and "self-speculation drafts with" in err
    assert again.engine.proposer.choice == choice


def test_a_calibrated_k_caps_the_drafts(target: Path, tmp_path: Path, plain: dict) -> None:
    path = tmp_path / "k2.json"
    SkipChoice(SKIP, 4, num_speculative_tokens=2).save(path)
    spec = SpecConfig(method="self", num_speculative_tokens=6, self_calibration=str(path))
    llm = LLM(model=str(target), batch_invariant=True, speculative=spec)
    assert_same(llm.generate(PROMPTS, GREEDY), plain_generate(plain, target, PROMPTS, GREEDY))
    stats = llm.engine.spec_stats
    assert 0 < stats.num_draft_tokens <= 2 * stats.num_verify_steps
    assert len(stats.per_position_acceptance_rate) == 2


def brute_force_accepted(agree: list[bool], k: int) -> float:
    """mean_accepted by its definition, one start at a time."""
    values = []
    for s in range(len(agree)):
        window = agree[s : s + k]
        run = next((i for i, a in enumerate(window) if not a), None)
        if run is not None:
            values.append(run)
        elif len(window) == k:
            values.append(k)
    return sum(values) / len(values) if values else 0.0


def test_mean_accepted_matches_its_definition() -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        agree = torch.rand(int(torch.randint(1, 30, (1,), generator=g)), generator=g) < 0.7
        k = int(torch.randint(1, 9, (1,), generator=g))
        expected = brute_force_accepted(agree.tolist(), k)
        assert mean_accepted([agree.tolist()], k) == pytest.approx(expected)
    assert mean_accepted([[True] * 10], 4) == 4.0 and mean_accepted([], 2) == 0.0


BAD_SPECS = [
    (dict(method="ngram", self_skip_layers=(1,)), "'ngram' does not use self_skip_layers"),
    (dict(method="draft_model", model="/d", self_calibration="c.json"),
     "does not use self_calibration"),
    (dict(method="self", self_skip_layers=(1,), self_calibration="c.json"), "not both"),
    (dict(method="self", self_skip_layers=()), "non-empty list"),
    (dict(method="self", self_skip_layers=(-1,)), "integers >= 0"),
    (dict(method="self", self_skip_layers=(1, True)), "integers >= 0"),
    (dict(method="self", self_skip_layers=3), "non-empty list"),
    (dict(method="self", self_skip_layers=(2, 2)), "names a layer twice"),
    (dict(method="self", self_calibration=""), "must be a file path"),
    (dict(method="self", model="/draft"), "'self' does not use model"),
    (dict(method="self", quantization="int8"), "'self' does not use quantization"),
]  # fmt: skip


@pytest.mark.parametrize(("options", "message"), BAD_SPECS)
def test_bad_options_are_value_errors(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_spec(SpecConfig(**options))  # as the resolver and the engine check it


def test_skip_layers_are_sorted_and_json_lists_accepted() -> None:
    spec = SpecConfig(method="self", self_skip_layers=[5, 1, 3])  # plain data until checked
    assert check_spec(spec).self_skip_layers == (1, 3, 5)


@pytest.mark.parametrize(
    ("skip", "message"),
    [((4,), r"layers \[4\] are outside 0..3"), ((0, 1, 2, 3), "skips all 4 layers")],
)
def test_skip_sets_the_target_cannot_take(target: Path, skip: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        self_llm(target, 2, skip)


def test_bad_calibration_files(target: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    SkipChoice((1,), 30, 2).save(other)
    with pytest.raises(ValueError, match="made for a target of 30 layers, this one has 4"):
        LLM(model=str(target), speculative=SpecConfig(method="self", self_calibration=str(other)))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="cannot be read"):
        LLM(model=str(target), speculative=SpecConfig(method="self", self_calibration=str(broken)))
    outside = tmp_path / "outside.json"
    SkipChoice((7,), 4, 2).save(outside)
    with pytest.raises(ValueError, match=r"outside 0\.\.3"):
        LLM(model=str(target), speculative=SpecConfig(method="self", self_calibration=str(outside)))


def test_cli_flags(target: Path, tmp_path: Path, capsys) -> None:
    from verispec.cli.main import main

    base = ["generate", "def add(a, b):", "--model", str(target), "--max-tokens", "8",
            "--method", "self", "--k", "3"]  # fmt: skip
    assert main([*base, "--self-skip-layers", "2,1"]) == 0
    err = capsys.readouterr().err
    assert "skips 1, 2" in err and "(self, k=3)" in err
    path = tmp_path / "cli.json"
    assert main([*base, "--self-calibration", str(path)]) == 0 and path.exists()
    capsys.readouterr()
    assert main([*base, "--self-skip-layers", "9"]) == 2
    assert "layers [9] are outside 0..3" in capsys.readouterr().err
    assert main(["generate", "x", "--method", "ngram", "--self-skip-layers", "1"]) == 2
    assert "does not use --self-skip-layers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--self-skip-layers", "one"])


# Sampling: the first tokens follow the target's exact distribution (test_sampling_distribution)


@pytest.fixture(scope="module")
def small_vocab_target(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PreTrainedModel]:
    """A 3-layer target over the 12-word vocabulary (test_sampling_distribution's, with two
    layers more); its draft skips the middle layer: acceptance 0.3-0.6 in these cases."""
    tokenizer = word_tokenizer()
    config = family_config(
        "llama", VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for w in model.model.layers.parameters():
            if w.dim() == 2:
                w.mul_(8.0)
        model.lm_head.weight.mul_(15.0)
    path = tmp_path_factory.mktemp("self-small-vocab")
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path, model


SAMPLING_CASES = [  # (temperature, top_p, top_k, max_tokens): k = max_tokens - 2 when drafting
    pytest.param(1.0, 1.0, -1, 3, id="t1.0-k1-bonus"),
    pytest.param(0.7, 1.0, -1, 4, id="t0.7-k2"),
    pytest.param(1.0, 0.9, 5, 4, id="t1.0-top_p0.9-top_k5-k2"),
]


@pytest.mark.parametrize(("temperature", "top_p", "top_k", "max_tokens"), SAMPLING_CASES)
def test_sampling_matches_the_target(
    small_vocab_target: tuple[Path, PreTrainedModel],
    temperature: float,
    top_p: float,
    top_k: int,
    max_tokens: int,
) -> None:
    path, model = small_vocab_target
    n = 3000
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k,
                            max_tokens=max_tokens, ignore_eos=True)  # fmt: skip
    spec = SpecConfig(method="self", self_skip_layers=(1,), num_speculative_tokens=2)
    counts, acceptance, drafted = run_case(path, DRAFT_PROMPT, params, spec, n)
    probs = exact_joint(model, DRAFT_PROMPT, params)
    result = fit(probs, [counts[c] for c in range(VOCAB**TOKENS)])
    print(f"{temperature=} {top_p=} {top_k=}: {result} {acceptance=} {drafted=}")
    assert result.ok(ALPHA), result
    assert drafted >= n * (max_tokens - 2)
    assert acceptance is not None and 0.2 <= acceptance <= 0.8, acceptance
