"""Medusa drafting (a static tree over K heads) is lossless: greedy output equals plain greedy
decoding token for token (batch-invariant mode), no KV block leaks, and the static tree has
the documented shape. The heads are trained in the module fixture on a sharp tiny target's own
responses, so multi-token paths are accepted and rejected."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.helpers.checkpoints import make_checkpoint
from verispec import LLM, SamplingParams, SpecConfig
from verispec.drafters.medusa import MedusaProposer, static_tree
from verispec.models.medusa import MedusaConfig, load_medusa_heads, save_medusa_heads
from verispec.models.paged import PagedModel
from verispec.models.weights.loader import load_model
from verispec.train.distill import (
    extract_features,
    generate_responses,
    load_features,
    read_responses,
)
from verispec.train.head_recipe import HeadRecipe, batch_maker, evaluate_head, head_objective
from verispec.train.medusa import TrainableMedusa
from verispec.train.trainer import TrainConfig, train

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = 320
LAST = slice(2 * 64, 3 * 64)  # stored layers (0, 1, 2): layer 2 = the last layer's output
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@dataclass(frozen=True)
class Trained:
    target: Path
    heads: Path
    untrained: Path
    prompts: list[list[int]]
    agreement: tuple[list[float], list[float]]
    """Top-1 agreement per head on the training records: untrained, trained (random prompts
    give the tiny target nothing to generalise from, so held-out figures are noise here)."""


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> Trained:
    root = tmp_path_factory.mktemp("medusa")
    target = root / "target"
    hf = make_checkpoint(target, "llama", tokenizer, layer_scale=8.0)
    with torch.no_grad():
        hf.lm_head.weight.mul_(16.0)
    hf.save_pretrained(str(target))
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, VOCAB, (int(n),), generator=g).tolist()
               for n in torch.randint(3, 12, (28,), generator=g)]  # fmt: skip
    llm = LLM(model=str(target), speculative=None, max_num_seqs=32)
    greedy = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    examples = read_responses(generate_responses(llm, prompts, root / "responses", greedy,
                                                 progress=False))  # fmt: skip
    model = load_model(target, torch.float32, torch.device("cpu"), "torch")
    records = list(load_features(extract_features(
        PagedModel(model, 128, 16), examples, (0, 1, 2), 8, root / "features", progress=False
    )))  # fmt: skip
    ids = torch.arange(VOCAB)
    config = MedusaConfig(3, 64, VOCAB, VOCAB)
    steps = TrainConfig(steps=80, batch_size=8, seq_len=64, lr=1e-2, warmup_steps=5,
                        weight_decay=0.0, bf16=False, checkpoint_every=1000)  # fmt: skip
    recipe = HeadRecipe(target=str(target), kind="medusa", train=steps)
    heads = TrainableMedusa(config, model.final_norm, model.config.rms_norm_eps, ids,
                            model.lm_head.weight)  # fmt: skip
    save_medusa_heads(config, heads.state_for_export(), root / "untrained", torch.float32)
    before = evaluate_head(heads, recipe, LAST, records)
    train(heads, batch_maker(records, steps), steps, root / "run",
          head_objective(recipe, LAST), progress=False)  # fmt: skip
    after = evaluate_head(heads, recipe, LAST, records)
    save_medusa_heads(config, heads.state_for_export(), root / "heads", torch.float32)
    return Trained(target, root / "heads", root / "untrained", prompts[:8], (before, after))


def medusa(path: Path, target: Path, k: int, topk: int | None = None,
           depth: int | None = None) -> LLM:  # fmt: skip
    spec = SpecConfig(method="medusa", model=str(path), num_speculative_tokens=k,
                      tree_topk=topk, tree_depth=depth)  # fmt: skip
    return LLM(model=str(target), speculative=spec, batch_invariant=True)


def test_static_tree_worked_example() -> None:
    assert static_tree(2, 2, 4) == [(0,), (1,), (0, 0), (0, 1)]


@pytest.mark.parametrize(("topk", "depth", "budget"), [(1, 3, 3), (2, 3, 6), (3, 4, 20)])
def test_static_tree_is_closed_under_prefixes(topk: int, depth: int, budget: int) -> None:
    paths = static_tree(topk, depth, budget)
    assert len(paths) == min(budget, sum(topk**d for d in range(1, depth + 1)))
    assert all(len(p) == 1 or p[:-1] in paths[: paths.index(p)] for p in paths)
    assert max(len(p) for p in paths) <= depth and all(max(p) < topk for p in paths)


def test_static_tree_rejects_sizes_below_one() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        static_tree(0, 2, 3)


def test_training_raises_agreement_of_every_head(trained: Trained) -> None:
    before, after = trained.agreement
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)


@pytest.mark.parametrize(("k", "topk", "depth"), [(3, None, None), (6, 2, 3), (10, 3, 3)])
def test_greedy_equals_plain(trained: Trained, k: int, topk: int | None,
                             depth: int | None) -> None:  # fmt: skip
    plain = LLM(model=str(trained.target), speculative=None, batch_invariant=True)
    ref = plain.generate(trained.prompts, GREEDY)
    llm = medusa(trained.heads, trained.target, k, topk, depth)
    out = llm.generate(trained.prompts, GREEDY)
    assert [o.token_ids for o in out] == [r.token_ids for r in ref]
    rate = llm.engine.spec_stats.acceptance_rate
    assert rate is not None and 0 < rate < 1, f"acceptance rate {rate}"
    proposer = llm.engine.proposer
    assert isinstance(proposer, MedusaProposer)
    assert llm.engine.allocator.num_used == 0 and not proposer.states


def test_trained_heads_accept_more_than_untrained(trained: Trained) -> None:
    rates = []
    for path in (trained.untrained, trained.heads):
        llm = medusa(path, trained.target, 6, 2, 3)
        llm.generate(trained.prompts, GREEDY)
        rates.append(llm.engine.spec_stats.mean_acceptance_length)
    assert rates[1] > rates[0], rates


def test_load_refuses_bad_checkpoints(trained: Trained, tmp_path: Path) -> None:
    model = load_model(trained.target, torch.float32, torch.device("cpu"), "torch")
    config = json.loads((trained.heads / "config.json").read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({**config, "architectures": ["Llama"]}))
    with pytest.raises(ValueError, match="not a Medusa checkpoint"):
        load_medusa_heads(bad, model, "torch")
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"lacks tensor '0\.0\.linear\.weight'"):
        load_medusa_heads(bad, model, "torch")
    shutil.copy(trained.heads / "model.safetensors", bad)
    (bad / "config.json").write_text(json.dumps({**config, "hidden_size": 32}))
    with pytest.raises(ValueError, match="has shape"):
        load_medusa_heads(bad, model, "torch")
    with pytest.raises(ValueError, match=r"no config\.json"):
        load_medusa_heads(tmp_path, model, "torch")


def test_topk_beyond_the_draft_vocabulary_is_refused(trained: Trained) -> None:
    with pytest.raises(ValueError, match="exceeds the head's draft vocabulary"):
        medusa(trained.heads, trained.target, 8, 400, 2)


def test_prefix_cache_hits_keep_medusa_output(trained: Trained) -> None:
    """Medusa reads only the last position's features, so a request may start after a cached
    prefix; repeated and extended prompts give plain decoding's output."""
    prompts = [trained.prompts[0], trained.prompts[0] + [5, 6], trained.prompts[0]]
    spec = SpecConfig(method="medusa", model=str(trained.heads), num_speculative_tokens=3)
    llm = LLM(model=str(trained.target), speculative=spec, batch_invariant=True, block_size=4,
              enable_prefix_caching=True)  # fmt: skip
    plain = LLM(model=str(trained.target), speculative=None, batch_invariant=True)
    got = [llm.generate(p, GREEDY)[0].token_ids for p in prompts]
    assert got == [o.token_ids for o in plain.generate(prompts, GREEDY)]
    assert llm.engine.prefix_cache is not None and llm.engine.prefix_cache.num_hits > 0
