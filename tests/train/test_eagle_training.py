"""The trainable EAGLE head: its unrolled depths compute exactly what the inference head computes
while drafting, its loss (soft targets, depth masking), resumable training, and learning."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.checkpoints import make_checkpoint
from verispec.kv import BlockAllocator, BlockTable
from verispec.models.batch import ForwardBatch
from verispec.models.eagle import EagleConfig, EagleHead, load_eagle_head, save_eagle_head
from verispec.models.kernels.build import NativeKernel, native_kernel
from verispec.models.llama import LlamaModel
from verispec.models.paged import PagedModel, append_chunk
from verispec.models.speculators import SpeculatorsMeta
from verispec.models.weights.loader import load_model
from verispec.train.distill import sequence_features
from verispec.train.eagle import TrainableEagle, head_loss, soft_targets
from verispec.train.head_recipe import HeadRecipe, batch_maker, evaluate_head, head_objective
from verispec.train.trainer import TrainConfig, train

pytestmark = pytest.mark.usefixtures("one_thread")
LAYERS = (0, 1, 2)
SEQUENCES = [
    [0, 17, 99, 3, 250, 41, 41, 7, 300, 12, 8, 19, 64, 5],
    [0, 5, 6, 7, 5, 6, 7, 200, 201, 9, 9, 9, 130, 77],
]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> LlamaModel:
    """A tiny 2-layer Llama (hidden 64, GQA 4/2 heads, vocab 320), loaded in float32."""
    path = tmp_path_factory.mktemp("eagle-train-target")
    make_checkpoint(path, "llama", tokenizer, layer_scale=8.0)
    return load_model(path, torch.float32, torch.device("cpu"), "torch")


VARIANTS = {
    "plain": {},
    "eagle-3.1": {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True},
    "fc-norm": {"norm_before_residual": True, "fc_norm": True},
}
"""EagleConfig switches: the plain EAGLE-3 layer, and the variants the speculators package
trains (its defaults for EAGLE-3 heads; the per-layer fused norms of EAGLE 3.1)."""
NATIVE = pytest.mark.skipif(not isinstance(native_kernel(), NativeKernel),
                            reason="no native kernel here")  # fmt: skip


@pytest.fixture(
    scope="module",
    params=[("plain", "torch"), ("eagle-3.1", "torch"), ("fc-norm", "torch"),
            pytest.param(("eagle-3.1", "native"), marks=NATIVE)],
    ids=lambda p: "-".join(p),
)  # fmt: skip
def heads(
    target: LlamaModel, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> tuple[TrainableEagle, EagleHead]:
    """A random trainable head (matrices scaled up so attention is sharp and rows differ, norm
    weights drawn around 1) of a layer variant, and the inference head loaded from its float32
    export: the plain one in the EAGLE-3 layout, the variants in the speculators one."""
    variant, backend = request.param
    config = replace(EagleConfig.for_target(target.config, 200, LAYERS), **VARIANTS[variant])
    torch.manual_seed(3)
    trainable = TrainableEagle(config, target.embed, torch.arange(60, 260))
    with torch.no_grad():
        for p in trainable.parameters():
            if p.dim() == 2:
                p.mul_(10.0)
            else:
                p.uniform_(0.5, 1.5)
    path = tmp_path_factory.mktemp("eagle-train-head")
    meta = None if variant == "plain" else SpeculatorsMeta("tiny-llama")
    save_eagle_head(config, trainable.state_for_export(), path, torch.float32, speculators=meta)
    head = load_eagle_head(path, target, backend)
    assert head.config == config and (head.native is not None) == (backend == "native")
    return trainable, head


def drafted_logits(head: EagleHead, tokens: list[int], features: torch.Tensor, r: int,
                   s: int) -> torch.Tensor:  # fmt: skip
    """Draft logits [draft vocab] of row r at depth s, as drafting computes them: one catch-up
    forward over rows 0..r-s+1 (row i: token i + 1, true features of position i), then s - 1
    single-row steps on tokens r-s+3..r+1, each fed the previous row's output."""
    table = BlockTable(BlockAllocator(16), 4)
    kv = head.new_kv_cache(16, 4)
    caught_up = r - s + 2
    chunk = append_chunk(table, tokens[1 : caught_up + 1])
    out, logits = head.forward(ForwardBatch.build([chunk], 4), kv,
                               head.fuse(features[:caught_up]))  # fmt: skip
    feature = out[-1:]  # [1, hidden]
    for row in range(caught_up, r + 1):
        chunk = append_chunk(table, [tokens[row + 1]])
        feature, logits = head.forward(ForwardBatch.build([chunk], 4), kv, feature)
    return logits[0]


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_unrolled_depths_equal_the_inference_heads_drafting(
    target: LlamaModel, heads: tuple[TrainableEagle, EagleHead], depth: int
) -> None:
    """Training's depth-s row r (both sequences of one batch) = drafting's row r at depth s,
    for every layer variant and on the native kernel too."""
    trainable, head = heads
    rows = [sequence_features(PagedModel(target, 16, 4), [ids], LAYERS, 4)[0][0].float()
            for ids in SEQUENCES]  # fmt: skip
    features = torch.stack(rows)  # [2, T, 3 * hidden]
    with torch.no_grad():
        unrolled = trainable(torch.tensor(SEQUENCES), features, depth)
    assert len(unrolled) == depth
    got = unrolled[depth - 1]  # [2, T - 1, draft vocab]
    for b, tokens in enumerate(SEQUENCES):
        for r in range(depth - 1, len(tokens) - 1):
            want = drafted_logits(head, tokens, features[b], r, depth)
            torch.testing.assert_close(got[b, r], want, atol=1e-4, rtol=0,
                                       msg=f"sequence {b}, row {r}")  # fmt: skip
    if depth > 1:  # the depth really matters: row r differs from the shallower depth's row r
        assert (got - unrolled[depth - 2])[:, depth - 1 :].abs().max() > 1.0


def test_soft_targets_worked_example() -> None:
    """Draft vocabulary = target ids 7 (draft id 0) and 3 (draft id 1) of 10."""
    to_draft = torch.full((10,), -1)
    to_draft[7], to_draft[3] = 0, 1
    top_ids = torch.tensor([[7, 9], [3, 7], [9, 8]])
    top_probs = torch.tensor([[0.6, 0.2], [0.3, 0.1], [0.5, 0.3]])
    ids, weights = soft_targets(to_draft, top_ids, top_probs)
    assert ids.tolist() == [[0, 0], [1, 0], [0, 0]]
    torch.testing.assert_close(weights, torch.tensor([[1.0, 0.0], [0.75, 0.25], [0.0, 0.0]]))


def loss_inputs() -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random logits for 3 depths [1, 5 rows, 4 draft ids] and one-hot-ish targets."""
    g = torch.Generator().manual_seed(0)
    logits = [torch.randn(1, 5, 4, generator=g) for _ in range(3)]
    ids = torch.tensor([[[2, 1], [0, 3], [1, 2], [3, 0], [2, 3]]])  # [1, 5, 2]
    weights = torch.tensor([[[0.7, 0.3]] * 5])
    mask = torch.ones(1, 5, dtype=torch.bool)
    return logits, ids, weights, mask


def test_head_loss_worked_value() -> None:
    """Soft cross-entropy per depth over its valid rows (depth d: rows r >= d - 1), summed
    with weights 0.8^(d - 1); agreement = argmax hits the target's most probable id."""
    logits, ids, weights, mask = loss_inputs()
    total, agreement = head_loss(logits, ids, weights, mask)
    want, hits = 0.0, []
    for d, lg in enumerate(logits, start=1):
        rows = range(d - 1, 5)
        logp = torch.log_softmax(lg[0], dim=-1)
        ce = [-(0.7 * logp[r, ids[0, r, 0]] + 0.3 * logp[r, ids[0, r, 1]]) for r in rows]
        want += 0.8 ** (d - 1) * float(sum(ce)) / len(ce)
        hits.append(sum(int(lg[0, r].argmax() == ids[0, r, 0]) for r in rows) / len(rows))
    assert float(total) == pytest.approx(want, rel=1e-6)
    assert agreement == pytest.approx(hits)


def test_head_loss_ignores_rows_without_a_true_feature_and_masked_rows() -> None:
    """Depth d's rows r < d - 1 (no true feature d - 1 steps back) and rows masked out do not
    count; row d - 1 does."""
    logits, ids, weights, mask = loss_inputs()
    total, agreement = head_loss(logits, ids, weights, mask)
    changed = [lg.clone() for lg in logits]
    changed[1][:, 0] = torch.tensor([0.0, 0.0, 50.0, 0.0])  # depth 2, row 0
    changed[2][:, :2] = torch.tensor([0.0, 0.0, 0.0, 50.0])  # depth 3, rows 0 and 1
    same, same_agreement = head_loss(changed, ids, weights, mask)
    assert float(same) == float(total) and same_agreement == agreement
    changed[2][:, 2] = -changed[2][:, 2]  # depth 3, row 2 reads position 0's true feature
    assert float(head_loss(changed, ids, weights, mask)[0]) != float(total)
    masked = mask.clone()
    masked[0, 4] = False
    changed = [lg.clone() for lg in logits]
    changed[0][:, 4] = 100.0 * torch.randn(4)
    assert float(head_loss(changed, ids, weights, masked)[0]) == pytest.approx(
        float(head_loss(logits, ids, weights, masked)[0])
    )


VOCAB, HIDDEN = 64, 32


def successor(x: torch.Tensor) -> torch.Tensor:
    """The synthetic target's next token: a bijection of 0..63, so walks cover every id."""
    return (7 * x + 3) % VOCAB


def walks(n: int, seed: int, length: int = 24) -> list[dict[str, Any]]:
    """Feature records (extract_features' layout) of a target that always says successor(x)
    with probability 0.8: token walks from random starts, random features, prompt_len 4."""
    g = torch.Generator().manual_seed(seed)
    records = []
    for _ in range(n):
        ids = [int(torch.randint(0, VOCAB, (1,), generator=g))]
        for _ in range(length - 1):
            ids.append(int(successor(torch.tensor(ids[-1]))))
        t = torch.tensor(ids)
        records.append({
            "token_ids": t.int(), "prompt_len": 4,
            "features": torch.randn(length, 2 * HIDDEN, generator=g).half(),
            "top_ids": torch.stack([successor(t), (t + 1) % VOCAB, (t + 2) % VOCAB], 1).int(),
            "top_probs": torch.tensor([0.8, 0.1, 0.05]).expand(length, 3).half(),
        })  # fmt: skip
    return records


def small_head() -> TrainableEagle:
    config = EagleConfig(
        hidden_size=HIDDEN, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64,
        vocab_size=VOCAB, draft_vocab_size=48, feature_layers=(0, 1),
    )  # fmt: skip
    embed = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    return TrainableEagle(config, embed, torch.arange(8, 56))


def recipe(steps: int, **train: Any) -> HeadRecipe:
    config = TrainConfig(steps=steps, batch_size=4, seq_len=24, lr=3e-2, warmup_steps=2,
                         weight_decay=0.0, bf16=False, **train)  # fmt: skip
    return HeadRecipe(target="synthetic", depths=3, train=config)


COLUMNS = slice(0, 2 * HIDDEN)


def test_resume_reproduces_an_uninterrupted_run(tmp_path: Path) -> None:
    """Killed after a checkpoint and resumed: the same weights as one uninterrupted run."""
    r = recipe(8, checkpoint_every=3)
    records = walks(8, seed=0)
    whole = small_head()
    train(whole, batch_maker(records, r.train), r.train, tmp_path / "whole",
          head_objective(r, COLUMNS), progress=False)  # fmt: skip

    calls = 0
    objective = head_objective(r, COLUMNS)

    def crashes_at_step_6(model: torch.nn.Module, batch: Any) -> torch.Tensor:
        nonlocal calls
        calls += 1
        if calls == 6:
            raise KeyboardInterrupt  # after the step-3 checkpoint, before the step-6 one
        return objective(model, batch)

    with pytest.raises(KeyboardInterrupt):
        train(small_head(), batch_maker(records, r.train), r.train, tmp_path / "split",
              crashes_at_step_6, progress=False)  # fmt: skip
    resumed = small_head()
    with torch.no_grad():
        resumed.fc.weight.add_(1.0)  # the weights must come from the checkpoint
    state = train(resumed, batch_maker(records, r.train), r.train, tmp_path / "split",
                  objective, resume=True, progress=False)  # fmt: skip
    assert state.step == 8
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert not torch.equal(whole.fc.weight, small_head().fc.weight)  # it did train


def test_a_few_steps_raise_heldout_agreement_at_every_depth(tmp_path: Path) -> None:
    r = recipe(60, checkpoint_every=100)
    heldout = walks(6, seed=99)
    model = small_head()
    before = evaluate_head(model, r, COLUMNS, heldout)
    losses = train(model, batch_maker(walks(32, seed=0), r.train), r.train, tmp_path,
                   head_objective(r, COLUMNS), progress=False).losses  # fmt: skip
    after = evaluate_head(model, r, COLUMNS, heldout)
    assert model.training  # evaluate_head restores training mode
    assert len(before) == len(after) == 3
    assert max(before) < 0.1  # about 1 / 48 by chance
    assert min(after) > 0.4, after
    assert sum(losses[-5:]) < 0.8 * sum(losses[:5])
    assert all(math.isfinite(x) for x in losses)
