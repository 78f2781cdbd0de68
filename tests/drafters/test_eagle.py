"""EAGLE drafting (chains and EAGLE-2 trees) is lossless: greedy output equals plain greedy
decoding token for token (batch-invariant mode), the KV cache after tree verification is what a
fresh prefill computes, no KV block leaks, and the head's incremental state (catch-up from the
target's features, rollback of draft rows) drafts exactly what a fresh head drafts.

The head is trained in the module fixture for 100 steps on a sharp tiny target's own greedy and
sampled responses, and the prompts are mostly the greedy training prompts (it has learnt those
continuations), so multi-token paths are accepted and rejected often.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.checkpoints import count_preemptions, make_checkpoint
from verispec import LLM, SamplingParams, SpecConfig
from verispec.drafters.eagle import EagleProposer
from verispec.drafters.ngram import propose_ngram
from verispec.drafters.registry import HEAD_METHOD
from verispec.engine.request import Request
from verispec.engine.runner import ModelRunner
from verispec.engine.step_drafts import StepDrafts
from verispec.kv import BlockAllocator, BlockTable
from verispec.models.batch import ForwardBatch
from verispec.models.eagle import EagleConfig, save_eagle_head
from verispec.models.paged import PagedModel, append_chunk
from verispec.models.weights.loader import load_model
from verispec.sample.tree import DraftTree
from verispec.spec.resolve import own_drafter
from verispec.train.distill import (
    extract_features,
    generate_responses,
    load_features,
    read_responses,
    token_frequencies,
)
from verispec.train.eagle import TrainableEagle
from verispec.train.head_recipe import HeadRecipe, batch_maker, head_objective
from verispec.train.trainer import TrainConfig, train
from verispec.types.outputs import RequestOutput

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = 320
LAYERS = (0, 1, 2)
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@dataclass(frozen=True)
class Trained:
    target: Path
    head: Path
    prompts: list[list[int]]
    """The greedy training prompts, of 3 to 11 tokens."""
    responses: list[list[int]]
    """The target's greedy responses to them (48 tokens each)."""


def random_prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 12, (n,), generator=g).tolist()
    return [torch.randint(3, VOCAB, (m,), generator=g).tolist() for m in lengths]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> Trained:
    """A sharp tiny target (layers x8, LM head x16: top-1 probability ~0.3) and an EAGLE head
    trained on its responses to 24 prompts (12 greedy, 12 sampled at T 1)."""
    root = tmp_path_factory.mktemp("eagle-drafting")
    target = root / "target"
    hf = make_checkpoint(target, "llama", tokenizer, layer_scale=8.0)
    with torch.no_grad():
        hf.lm_head.weight.mul_(16.0)
    hf.save_pretrained(str(target))
    prompts = random_prompts(24, seed=0)
    llm = LLM(model=str(target), speculative=None, max_num_seqs=32)
    greedy = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    sampled = SamplingParams(temperature=1.0, max_tokens=48, ignore_eos=True, seed=0)
    paths = generate_responses(llm, prompts[:12], root / "greedy", greedy, progress=False)
    paths += generate_responses(llm, prompts[12:], root / "sampled", sampled, progress=False)
    examples = read_responses(paths)
    model = load_model(target, torch.float32, torch.device("cpu"), "torch")
    records = list(load_features(extract_features(
        PagedModel(model, 128, 16), examples, LAYERS, 8, root / "features", progress=False
    )))  # fmt: skip
    ranked = torch.sort(token_frequencies(examples, VOCAB), descending=True, stable=True)
    draft_ids = ranked.indices[:256].sort().values
    config = EagleConfig.for_target(model.config, 256, LAYERS)
    torch.manual_seed(0)
    head = TrainableEagle(config, model.embed, draft_ids, model.lm_head.weight[draft_ids])
    steps = TrainConfig(steps=100, batch_size=8, seq_len=64, lr=1e-2, warmup_steps=5,
                        weight_decay=0.0, bf16=False, checkpoint_every=1000)  # fmt: skip
    recipe = HeadRecipe(target=str(target), depths=3, train=steps)
    train(head, batch_maker(records, steps), steps, root / "run",
          head_objective(recipe, slice(0, 3 * 64)), progress=False)  # fmt: skip
    save_eagle_head(config, head.state_for_export(), root / "head", torch.float32)
    return Trained(target, root / "head", [p for p, _ in examples[:12]],
                   [r for _, r in examples[:12]])  # fmt: skip


@pytest.fixture(scope="module")
def plain() -> dict[Any, list[RequestOutput]]:
    """Plain greedy outputs, cached per (prompts, params, engine options)."""
    return {}


def plain_generate(cache: dict, trained: Trained, prompts: list, params: Any,
                   **engine: Any) -> list[RequestOutput]:  # fmt: skip
    key = (repr(prompts), repr(params), tuple(sorted(engine.items())))
    if key not in cache:
        llm = LLM(model=str(trained.target), speculative=None, batch_invariant=True, **engine)
        cache[key] = llm.generate(prompts, params)
    return cache[key]


def eagle(trained: Trained, k: int, topk: int | None = None, depth: int | None = None,
          lookup: int | None = None, **engine: Any) -> LLM:  # fmt: skip
    spec = SpecConfig(method="eagle", model=str(trained.head), num_speculative_tokens=k,
                      tree_topk=topk, tree_depth=depth, prompt_lookup_tokens=lookup,
                      prompt_lookup_min=1 if lookup else None)  # fmt: skip
    return LLM(model=str(trained.target), speculative=spec, batch_invariant=True, **engine)


def assert_same(spec: list[RequestOutput], ref: list[RequestOutput]) -> None:
    assert len(spec) == len(ref)
    for i, (s, r) in enumerate(zip(spec, ref, strict=True)):
        assert s.token_ids == r.token_ids, f"prompt {i}: speculative output differs from plain"
        assert s.finish_reason == r.finish_reason, f"prompt {i}"


def assert_partial_and_clean(llm: LLM) -> None:
    """Some drafts were accepted and some rejected; every target and head block is free."""
    rate = llm.engine.spec_stats.acceptance_rate
    assert rate is not None and 0 < rate < 1, f"acceptance rate {rate}"
    engine, proposer = llm.engine, llm.engine.proposer
    assert isinstance(proposer, EagleProposer)
    assert engine.allocator.num_used == 0, "target KV blocks leaked"
    assert proposer.allocator.num_used == 0 and not proposer.states, "head KV blocks leaked"


def spy_drafts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[int], Any]]:
    """Record (num_tokens asked, Drafts) of every EagleProposer.propose call."""
    calls: list[tuple[list[int], Any]] = []
    propose = EagleProposer.propose

    def spy(self: EagleProposer, requests: Any, num_tokens: Any) -> Any:
        drafts = propose(self, requests, num_tokens)
        calls.append((list(num_tokens), drafts))
        return drafts

    monkeypatch.setattr(EagleProposer, "propose", spy)
    return calls


def test_the_trained_head_is_accepted_often(trained: Trained) -> None:
    """The fixture's premise: more than half a draft accepted per step, paths of 2+ tokens."""
    llm = eagle(trained, 4)
    llm.generate(trained.prompts, GREEDY)
    stats = llm.engine.spec_stats
    assert stats.num_accepted_tokens / stats.num_verify_steps > 0.5, stats
    assert stats.accepted_per_position[2] > 0, stats


# (num_speculative_tokens = the node budget for trees, tree_topk, tree_depth)
SPECS = {
    "chain-k1": (1, None, None),
    "chain-k4": (4, None, None),
    "tree-2x3-5": (5, 2, 3),
    "tree-3x4-12": (12, 3, 4),
    "tree-4x6-24": (24, 4, 6),
    "tree-budget-1": (1, 2, 3),
    "tree-3x4-4": (4, 3, 4),
}


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_greedy_equals_plain(trained: Trained, spec: tuple, plain: dict, monkeypatch) -> None:
    """Prompts of different lengths in one batch (their trees differ), 2 of them unseen."""
    k, topk, depth = spec
    prompts = [*trained.prompts[:6], *random_prompts(2, seed=7)]
    calls = spy_drafts(monkeypatch)
    llm = eagle(trained, k, topk, depth)
    assert_same(llm.generate(prompts, GREEDY), plain_generate(plain, trained, prompts, GREEDY))
    assert_partial_and_clean(llm)
    stats = llm.engine.spec_stats
    assert stats.num_draft_tokens <= k * stats.num_verify_steps
    if k > 1:
        assert stats.accepted_per_position[1] > 0, "no path of 2 drafts was ever accepted"
    for asked, drafts in calls:
        assert (drafts.trees is None) == (topk is None)
        for n, ids in zip(asked, drafts.token_ids, strict=True):
            # a tree fills its budget n from its K + (levels - 1) * K^2 candidates
            levels = min(depth or n, n)
            assert len(ids) == (n if topk is None else min(n, topk + (levels - 1) * topk**2))
    if topk is not None and k > topk:  # real trees: branching, several levels, not all alike
        trees = [t for _, d in calls for t in d.trees]
        assert any(len(t.children(-1)) > 1 for t in trees)
        assert max(max(t.depths(), default=0) for t in trees) > 1
        assert any(len({tuple(t.parents) for t in d.trees}) > 1 for _, d in calls)


def test_compiled_head_and_target_keep_greedy_output(trained: Trained) -> None:
    """With compile the head's step and the target's stack run as compiled graphs (trees,
    their masks and a grafted lookup included); output equals compiled plain decoding."""
    prompts = [*trained.prompts[:4], *random_prompts(2, seed=7)]
    spec = SpecConfig(method="eagle", model=str(trained.head), num_speculative_tokens=8,
                      tree_topk=3, tree_depth=3, prompt_lookup_tokens=3)  # fmt: skip
    llm = LLM(model=str(trained.target), speculative=spec, compile=True)
    ref = LLM(model=str(trained.target), speculative=None, compile=True)
    assert_same(llm.generate(prompts, GREEDY), ref.generate(prompts, GREEDY))
    assert_partial_and_clean(llm)
    head = llm.engine.proposer.head  # type: ignore[union-attr]
    assert head.compiled is not None and head.compiled.num_compilations > 0
    assert head.compiled.failure is None


def test_grafted_lookups_keep_greedy_output(trained: Trained, plain: dict, monkeypatch) -> None:
    """Trees with a prompt-lookup chain grafted on: each tree holds the lookup's chain as a
    root path, stays within its budget, and greedy output equals plain decoding."""
    prompts = [*trained.prompts[:6], *random_prompts(2, seed=7)]
    seen: list[tuple[list[int], int, DraftTree]] = []  # (context, budget, tree)
    propose = EagleProposer.propose

    def spy(self: EagleProposer, requests: Any, num_tokens: Any) -> Any:
        contexts = [list(r.all_token_ids) for r in requests]
        drafts = propose(self, requests, num_tokens)
        seen.extend(zip(contexts, num_tokens, drafts.trees, strict=True))
        return drafts

    monkeypatch.setattr(EagleProposer, "propose", spy)
    llm = eagle(trained, 8, 2, 3, lookup=3)
    assert_same(llm.generate(prompts, GREEDY), plain_generate(plain, trained, prompts, GREEDY))
    assert_partial_and_clean(llm)
    grafted = 0
    for context, budget, t in seen:
        chain = propose_ngram(context, 1, 4, min(3, budget - 1))
        assert t.num_nodes <= budget
        paths = {tuple(t.token_ids[n] for n in t.path(i)) for i in range(t.num_nodes)}
        assert not chain or tuple(chain) in paths
        grafted += bool(chain)
    assert grafted > len(seen) // 8, "the lookup rarely found a match: the test lost its point"


@pytest.mark.parametrize("spec", [SPECS["chain-k4"], SPECS["tree-3x4-12"]], ids=["chain", "tree"])
def test_max_tokens_shrinks_the_budget(
    trained: Trained, spec: tuple, plain: dict, monkeypatch
) -> None:
    """max_tokens below, at and just above the budget: exactly max_tokens tokens each; the
    scheduler shrinks the budget near the end and no request drafts past what it is offered."""
    k, topk, depth = spec
    prompts = trained.prompts[:8]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True)
              for m in (1, 2, 3, 5, k, k + 1, k + 2, 2 * k + 3)]  # fmt: skip
    calls = spy_drafts(monkeypatch)
    llm = eagle(trained, k, topk, depth)
    out = llm.generate(prompts, params)
    assert_same(out, plain_generate(plain, trained, prompts, params))
    assert [len(o.token_ids) for o in out] == [p.max_tokens for p in params]
    assert any(0 < n < k for asked, _ in calls for n in asked), "the budget never shrank"
    for asked, drafts in calls:
        assert all(len(ids) <= n for ids, n in zip(drafts.token_ids, asked, strict=True))
    assert_partial_and_clean(llm)


@pytest.mark.parametrize("spec", [SPECS["chain-k4"], SPECS["tree-4x6-24"]], ids=["chain", "tree"])
def test_context_limit(trained: Trained, spec: tuple, plain: dict, monkeypatch) -> None:
    """Prompts a few tokens short of max_model_len (training prompts continued by the target's
    own response): they end with "length" at exactly max_model_len, no draft placed past it."""
    prompts = [p + r[: 44 - len(p) + i % 3] for i, (p, r)
               in enumerate(zip(trained.prompts, trained.responses, strict=True))][:6]  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    ends = []
    execute = ModelRunner.execute

    def spy(self: ModelRunner, scheduled: list, drafts: StepDrafts, *args: Any) -> Any:
        ends.extend(s.start + len(s.token_ids) + len(ids)
                    for s, ids in zip(scheduled, drafts.token_ids, strict=True))
        return execute(self, scheduled, drafts, *args)

    monkeypatch.setattr(ModelRunner, "execute", spy)
    llm = eagle(trained, *spec, max_model_len=48)
    out = llm.generate(prompts, params)
    assert_same(out, plain_generate(plain, trained, prompts, params, max_model_len=48))
    assert max(ends) == 48
    for o in out:
        assert o.finish_reason == "length"
        assert len(o.prompt_token_ids) + len(o.token_ids) == 48
    assert llm.engine.spec_stats.num_accepted_tokens > 0


BATCHING = {
    "chunked-prefill": dict(max_num_batched_tokens=8),
    "two-seqs": dict(max_num_seqs=2),
    "preemption": dict(block_size=4, num_blocks=12, max_model_len=48),
}


@pytest.mark.parametrize("engine", BATCHING.values(), ids=BATCHING.keys())
def test_batch_compositions(trained: Trained, engine: dict, plain: dict, monkeypatch) -> None:
    """Prefill chunks hand features over piecewise; requests join mid-run; preempted requests
    drop the head's state and recompute it: the tokens stay the same, nothing leaks."""
    preemptions = count_preemptions(monkeypatch)
    prompts = trained.prompts[:6]
    llm = eagle(trained, 12, 3, 4, **engine)
    out = llm.generate(prompts, GREEDY)
    assert_same(out, plain_generate(plain, trained, prompts, GREEDY, **engine))
    assert_partial_and_clean(llm)
    assert bool(preemptions) == ("num_blocks" in engine)


@pytest.mark.parametrize("spec", [SPECS["chain-k4"], SPECS["tree-3x4-12"]], ids=["chain", "tree"])
def test_greedy_requests_in_a_sampled_batch(trained: Trained, spec: tuple, plain: dict) -> None:
    """Sampled requests beside greedy ones (with and without a repetition penalty): the greedy
    ones still equal plain decoding; the sampled ones get their max_tokens."""
    prompts = trained.prompts[:6]
    greedy = [GREEDY, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True,
                                     repetition_penalty=1.3)]  # fmt: skip
    sampled = [
        SamplingParams(temperature=t, top_p=0.9, top_k=k, max_tokens=24, ignore_eos=True, seed=i)
        for i, (t, k) in enumerate([(0.7, -1), (1.0, 20)])
    ]
    params = [greedy[0], sampled[0], greedy[1], sampled[1], greedy[0], greedy[1]]
    llm = eagle(trained, *spec)
    out = llm.generate(prompts, params)
    ref = plain_generate(plain, trained, prompts, params)
    for i, (o, r, p) in enumerate(zip(out, ref, params, strict=True)):
        assert len(o.token_ids) == 24
        if p.temperature == 0:
            assert o.token_ids == r.token_ids, f"greedy prompt {i}"
    assert_partial_and_clean(llm)


def test_kv_after_tree_verification_equals_a_fresh_prefill(trained: Trained, monkeypatch) -> None:
    """Mid-run, each request's target KV (accepted tree paths moved into place) equals the KV
    a fresh prefill of its computed tokens writes."""
    moved = []
    keep = ModelRunner._keep_paths

    def spy(self: ModelRunner, sampling: list, paths: list) -> None:
        moved.extend(n for path in paths for depth, n in enumerate(path) if n != depth)
        keep(self, sampling, paths)

    monkeypatch.setattr(ModelRunner, "_keep_paths", spy)
    llm = eagle(trained, 12, 3, 4)
    engine = llm.engine
    requests = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=40,
                                                     ignore_eos=True))
                for p in trained.prompts[:6]]  # fmt: skip
    for _ in range(8):
        engine.step()
    assert moved, "no accepted path left the first branch: nothing was moved"
    fresh = PagedModel(engine.model, 64, 16)
    for r in requests:
        n = r.num_computed_tokens
        assert not r.finished and n > len(r.prompt_token_ids)
        table = fresh.new_table()
        fresh.forward([append_chunk(table, r.all_token_ids[:n])])
        have = torch.tensor(r.block_table.slots(0, n))
        want = torch.tensor(table.slots(0, n))
        kv = engine.runner.target.kv
        for got, expected in zip(kv.read(have), fresh.kv.read(want), strict=True):
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
        table.free()


@pytest.mark.parametrize("spec", [SPECS["chain-k4"], SPECS["tree-3x4-12"]], ids=["chain", "tree"])
def test_drafts_equal_a_fresh_heads(trained: Trained, spec: tuple, monkeypatch) -> None:
    """After many steps of catch-up and rollback, the engine's proposer drafts exactly what a
    new proposer drafts from the target's features of the whole sequence read at once."""
    calls: list[tuple[list[int], int, Any]] = []
    propose = EagleProposer.propose

    def spy(self: EagleProposer, requests: Any, num_tokens: Any) -> Any:
        drafts = propose(self, requests, num_tokens)
        for i, r in enumerate(requests):
            tree = None if drafts.trees is None else drafts.trees[i]
            calls.append((list(r.all_token_ids), num_tokens[i], (drafts.token_ids[i], tree)))
        return drafts

    monkeypatch.setattr(EagleProposer, "propose", spy)
    k, topk, depth = spec
    llm = eagle(trained, k, topk, depth)
    llm.generate(trained.prompts[:4], GREEDY)
    proposer = llm.engine.proposer
    fresh = EagleProposer(proposer.head, k, topk or 1, depth or 1, proposer.target)
    paged = PagedModel(llm.engine.model, 64, 16)
    late = [c for c in calls if len(c[0]) > 20][::3]  # well into the run
    assert len(late) >= 4
    for n, (tokens, asked, want) in enumerate(late):
        table = paged.new_table()
        _, features = paged.forward_with_features([append_chunk(table, tokens[:-1])], LAYERS)
        table.free()
        request = Request(f"fresh-{n}", None, tokens, SamplingParams(temperature=0), None, None,
                          frozenset(), 256)  # fmt: skip
        fresh.observe(request, 0, features)
        drafts = fresh.propose([request], [asked])
        fresh.release(request)
        tree = None if drafts.trees is None else drafts.trees[0]
        assert (drafts.token_ids[0], tree) == want, f"call {n}"
    assert fresh.allocator.num_used == 0


@pytest.fixture(scope="module")
def sharp_head(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random head with matrices scaled up: its drafts depend strongly on the features, the
    tree mask and the positions it is given (a trained head's top tokens barely do)."""
    model = load_model(trained.target, torch.float32, torch.device("cpu"), "torch")
    config = EagleConfig.for_target(model.config, 200, LAYERS)
    torch.manual_seed(5)
    head = TrainableEagle(config, model.embed, torch.arange(100, 300))
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 2:
                p.mul_(10.0)
        head.lm_head.weight.mul_(4.0)  # peaked q: the best paths go several levels deep
    path = tmp_path_factory.mktemp("sharp-head")
    save_eagle_head(config, head.state_for_export(), path, torch.float32)
    return path


def path_logprobs(proposer: EagleProposer, features: torch.Tensor, tokens: list[int],
                  path: list[int]) -> torch.Tensor:  # fmt: skip
    """log q [draft vocab] after `path` (draft tokens after `tokens`), computed as a chain:
    catch-up over every true row, then one single-row step per path token."""
    head = proposer.head
    table = BlockTable(BlockAllocator(32), 16)
    kv = head.new_kv_cache(32, 16)
    chunk = append_chunk(table, tokens[1:])
    out, logits = head.forward(ForwardBatch.build([chunk], 16), kv, head.fuse(features))
    out = out[-1:]
    for token in path:
        out, logits = head.forward(ForwardBatch.build([append_chunk(table, [token])], 16), kv, out)
    return torch.log_softmax(logits[0], dim=-1)


def reference_tree(proposer: EagleProposer, features: torch.Tensor, tokens: list[int],
                   budget: int) -> set[tuple[int, ...]]:  # fmt: skip
    """EAGLE-2 from chain runs: expand each frontier path's top-K, keep the K best new paths
    by cumulative log q as the next frontier, for min(depth, budget) levels; then the
    `budget` best paths whose every prefix is kept. Returns the kept token paths."""
    k, to_target = proposer.topk, proposer.head.draft_to_target
    scores: dict[tuple[int, ...], float] = {}
    frontier: list[tuple[int, ...]] = [()]
    for _ in range(min(proposer.depth, budget)):
        new = {}
        for path in frontier:
            logq, ids = path_logprobs(proposer, features, tokens, list(path)).topk(k)
            base = scores.get(path, 0.0)
            for lq, t in zip(logq.tolist(), to_target[ids].tolist(), strict=True):
                new[(*path, t)] = base + lq
        scores.update(new)
        frontier = sorted(new, key=lambda p: -new[p])[:k]
    kept: set[tuple[int, ...]] = set()
    for path in sorted(scores, key=lambda p: (-scores[p], len(p))):
        if len(kept) < budget and (len(path) == 1 or path[:-1] in kept):
            kept.add(path)
    return kept


def test_trees_are_eagle2_trees_of_the_heads_chain_runs(
    trained: Trained, sharp_head: Path, monkeypatch
) -> None:
    """Each drafted tree is the EAGLE-2 tree recomputed from single-path chain runs of the
    head: the batched level forwards (tree mask, rotary positions, each node's parent output
    as its feature) compute what a chain computes along each path."""
    calls: list[tuple[list[int], int, Any]] = []
    propose = EagleProposer.propose

    def spy(self: EagleProposer, requests: Any, num_tokens: Any) -> Any:
        drafts = propose(self, requests, num_tokens)
        for r, n, tree in zip(requests, num_tokens, drafts.trees, strict=True):
            calls.append((list(r.all_token_ids), n, tree))
        return drafts

    monkeypatch.setattr(EagleProposer, "propose", spy)
    spec = SpecConfig(method="eagle", model=str(sharp_head), num_speculative_tokens=16,
                      tree_topk=3, tree_depth=5)  # fmt: skip
    llm = LLM(model=str(trained.target), speculative=spec, batch_invariant=True)
    llm.generate(trained.prompts[:3], SamplingParams(temperature=0, max_tokens=16,
                                                     ignore_eos=True))  # fmt: skip
    proposer = llm.engine.proposer
    paged = PagedModel(llm.engine.model, 64, 16)
    checked = 0
    for tokens, budget, tree in calls[::3]:
        table = paged.new_table()
        _, features = paged.forward_with_features([append_chunk(table, tokens[:-1])], LAYERS)
        table.free()
        paths = {tuple(tree.token_ids[n] for n in tree.path(i)) for i in range(tree.num_nodes)}
        assert paths == reference_tree(proposer, features, tokens, budget)
        checked += max(map(len, paths)) >= 3
    assert checked >= 3


@pytest.mark.parametrize("spec", [SPECS["chain-k4"], SPECS["tree-3x4-12"]], ids=["chain", "tree"])
def test_stops_inside_an_accepted_path(trained: Trained, spec: tuple, plain: dict) -> None:
    """EOS counts and stop ids end the output where plain decoding ends it, although the
    verifier emitted tokens past the stop in the same step."""
    prompts = trained.prompts[:6]
    ref = plain_generate(plain, trained, prompts, GREEDY)
    params = [SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[r.token_ids[8 + i]])
              for i, r in enumerate(ref)]  # fmt: skip
    llm = eagle(trained, *spec)
    out = llm.generate(prompts, params)
    assert_same(out, plain_generate(plain, trained, prompts, params))
    assert all(o.finish_reason == "stop" for o in out)
    assert_partial_and_clean(llm)


def test_an_aborted_request_frees_its_head_blocks(trained: Trained) -> None:
    llm = eagle(trained, 12, 3, 4)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    requests = [engine.add_request(p, params) for p in trained.prompts[:3]]
    for _ in range(4):
        engine.step()
    engine.abort_request(requests[1])
    assert requests[1].request_id not in engine.proposer.states
    while engine.has_unfinished():
        engine.step()
    assert [len(r.output_token_ids) for r in requests[::2]] == [30, 30]
    assert engine.allocator.num_used == 0 and engine.proposer.allocator.num_used == 0


@pytest.mark.parametrize("spec", [SPECS["chain-k4"], SPECS["tree-3x4-12"]], ids=["chain", "tree"])
def test_a_single_request_without_batch_invariance(trained: Trained, spec: tuple) -> None:
    """The default mode's one-sequence fast path (keys read in place) honours the tree masks
    of the target's verify forward and of the head's level forwards."""
    k, topk, depth = spec
    head = SpecConfig(method="eagle", model=str(trained.head), num_speculative_tokens=k,
                      tree_topk=topk, tree_depth=depth)  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    llm = LLM(model=str(trained.target), speculative=head)
    out = llm.generate(trained.prompts[:1], params)
    ref = LLM(model=str(trained.target), speculative=None).generate(trained.prompts[:1], params)
    assert out[0].token_ids == ref[0].token_ids
    stats = llm.engine.spec_stats
    assert stats.num_accepted_tokens / stats.num_verify_steps > 0.5


def test_a_one_token_prompt(trained: Trained, plain: dict) -> None:
    prompts = [[5], trained.prompts[0]]
    out = eagle(trained, 12, 3, 4).generate(prompts, GREEDY)
    assert_same(out, plain_generate(plain, trained, prompts, GREEDY))


def test_shipped_code_head_keeps_the_greedy_output() -> None:
    """The embedded code model's own head, with its tuned tree and grafted lookup: greedy
    output equals plain decoding, and it drafts well (mean acceptance length 3.14 on these
    prompts; an untrained head gets about 1)."""
    spec = own_drafter("embedded-code", HEAD_METHOD)
    assert spec is not None and spec.prompt_lookup_tokens
    prompts = ["def read_config(path):\n", "class Queue:\n    def __init__(self):", "import os"]
    params = SamplingParams(temperature=0, max_tokens=32)
    plain = LLM(model="embedded-code", speculative=None, batch_invariant=True)
    head = LLM(model="embedded-code", speculative=spec, batch_invariant=True)
    assert_same(head.generate(prompts, params), plain.generate(prompts, params))
    assert head.engine.spec_stats.mean_acceptance_length > 2.0


@pytest.mark.parametrize("topk", [None, 2], ids=["chain", "tree"])
def test_prefix_caching_shares_the_heads_blocks_too(
    trained: Trained, plain: dict, monkeypatch: pytest.MonkeyPatch, topk: int | None
) -> None:
    """Prompts sharing a 40-token prefix on a cache small enough to evict: later requests start
    from cached target and head blocks (the head adopts as many as the target reuses), and
    output equals plain decoding (greedy) and the same engine without the cache (sampled)."""
    adopted: list[int] = []
    adopt = EagleProposer.adopt_prefix

    def counting(self: EagleProposer, request_id: str, ids: list[int], n: int) -> None:
        adopted.append(n)
        adopt(self, request_id, ids, n)

    monkeypatch.setattr(EagleProposer, "adopt_prefix", counting)
    prefix = [t for p in random_prompts(12, seed=7) for t in p][:40]
    prompts = [prefix + tail for tail in random_prompts(2, seed=8)] * 2
    sampled = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=3)
    depth = 3 if topk else None
    options = dict(block_size=4, num_blocks=24, max_model_len=96)
    llm = eagle(trained, 4, topk, depth, enable_prefix_caching=True, **options)
    ref = plain_generate(plain, trained, prompts, GREEDY)
    assert_same([llm.generate(p, GREEDY)[0] for p in prompts], ref)
    cache = llm.engine.prefix_cache
    assert cache is not None and cache.num_hits >= 3 * 36  # at least 9 of 10 prefix blocks, 3 times
    assert sum(adopted) * 4 == cache.num_hits  # the head started where the target did
    with_cache = [llm.generate(p, sampled)[0].token_ids for p in prompts]
    no_cache = eagle(trained, 4, topk, depth, **options)
    assert with_cache == [no_cache.generate(p, sampled)[0].token_ids for p in prompts]
    assert llm.engine.allocator.num_used == 0 and llm.engine.proposer.allocator.num_used == 0
