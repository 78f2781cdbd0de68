"""The training loop: deterministic batches, schedule, resume equals an uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from verispec.train.trainer import (
    CHECKPOINT,
    TrainConfig,
    batch_at,
    distill_loss,
    distillation_objective,
    heldout_loss,
    language_model_objective,
    load_trained,
    to_device,
    train,
)

VOCAB = 64


def tiny_model(seed: int = 0, layers: int = 1) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def periodic_tokens(n: int = 4000) -> torch.Tensor:
    """A corpus a tiny model can learn: 0 1 2 ... 15 0 1 2 ..."""
    return (torch.arange(n) % 16).to(torch.int32)


def config(steps: int, **kw: object) -> TrainConfig:
    return TrainConfig(steps=steps, batch_size=4, seq_len=32, lr=1e-2, warmup_steps=2,
                       checkpoint_every=3, bf16=False, **kw)  # fmt: skip


def test_lr_schedule_worked_example() -> None:
    c = TrainConfig(steps=110, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert c.lr_at(0) == pytest.approx(0.1)
    assert c.lr_at(9) == pytest.approx(1.0)
    assert c.lr_at(10) == pytest.approx(1.0)
    assert c.lr_at(60) == pytest.approx(0.55)  # half way down the cosine
    assert c.lr_at(110) == pytest.approx(0.1)


@pytest.mark.parametrize("field", ["steps", "batch_size", "seq_len", "checkpoint_every"])
def test_config_rejects_non_positive_sizes(field: str) -> None:
    kwargs = {"steps": 1, field: 0}
    with pytest.raises(ValueError, match=field):
        TrainConfig(**kwargs)


def test_batches_are_a_function_of_seed_and_step() -> None:
    tokens = torch.arange(1000, dtype=torch.int32)
    c = config(5)
    a, b = batch_at(tokens, 3, c), batch_at(tokens, 3, c)
    assert torch.equal(a, b) and a.shape == (4, 33) and a.dtype == torch.int64
    assert not torch.equal(a, batch_at(tokens, 4, c))
    assert torch.equal(a[:, 1:] - a[:, :-1], torch.ones(4, 32, dtype=torch.int64))  # windows
    with pytest.raises(ValueError, match="need more"):
        batch_at(tokens[:20], 0, c)


def test_training_learns_a_periodic_corpus(tmp_path: Path) -> None:
    model, tokens = tiny_model(), periodic_tokens()
    before = heldout_loss(model, tokens[:200], seq_len=32)
    state = train(model, tokens, config(30), tmp_path, language_model_objective(), progress=False)
    after = heldout_loss(model, tokens[:200], seq_len=32)
    assert state.step == 30 and len(state.losses) == 30
    assert before > 3.0 and after < 0.5 * before


def test_to_device_moves_tensors_and_keeps_plain_values() -> None:
    batch = {"ids": torch.arange(3), "n": 7, "nested": {"x": torch.ones(2)}}
    moved = to_device(batch, torch.device("meta"))
    assert moved["ids"].device.type == "meta" and moved["nested"]["x"].device.type == "meta"
    assert moved["n"] == 7 and batch["ids"].device.type == "cpu"


def test_training_on_a_named_device_moves_the_model_there(tmp_path: Path) -> None:
    """device=cpu (the one device every machine has) trains like the default: same losses."""
    a, b, tokens = tiny_model(), tiny_model(), periodic_tokens()
    plain = train(a, tokens, config(4), tmp_path / "a", language_model_objective(), progress=False)
    named = train(b, tokens, config(4), tmp_path / "b", language_model_objective(),
                  progress=False, device=torch.device("cpu"))  # fmt: skip
    assert named.losses == plain.losses


def test_resume_reproduces_an_uninterrupted_run(tmp_path: Path) -> None:
    tokens = periodic_tokens()
    whole = tiny_model()
    train(whole, tokens, config(8), tmp_path / "whole", language_model_objective(), progress=False)

    calls = 0

    def crashes_at_step_6(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        calls += 1
        if calls == 6:
            raise KeyboardInterrupt  # killed after the step-3 checkpoint, before the step-6 one
        return language_model_objective()(model, batch)

    with pytest.raises(KeyboardInterrupt):
        train(tiny_model(), tokens, config(8), tmp_path / "split", crashes_at_step_6,
              progress=False)  # fmt: skip
    resumed = tiny_model(seed=123)  # weights come from the checkpoint, not the init
    state = train(resumed, tokens, config(8), tmp_path / "split", language_model_objective(),
                  resume=True, progress=False)  # fmt: skip
    assert state.step == 8
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_existing_run_needs_resume_and_same_settings(tmp_path: Path) -> None:
    tokens = periodic_tokens()
    train(tiny_model(), tokens, config(3), tmp_path, language_model_objective(), progress=False)
    with pytest.raises(ValueError, match="--resume"):
        train(tiny_model(), tokens, config(3), tmp_path, language_model_objective(), progress=False)
    with pytest.raises(ValueError, match="lr"):
        changed = TrainConfig(steps=3, batch_size=4, seq_len=32, lr=5e-3, warmup_steps=2,
                              checkpoint_every=3, bf16=False)  # fmt: skip
        train(tiny_model(), tokens, changed, tmp_path, language_model_objective(), resume=True,
              progress=False)  # fmt: skip
    model = tiny_model(seed=9)
    assert load_trained(model, tmp_path).step == 3


@pytest.mark.parametrize("damage", ["truncate", "garbage", "not-a-checkpoint"])
def test_corrupt_checkpoint_is_named_not_unpickled(tmp_path: Path, damage: str) -> None:
    tokens = periodic_tokens()
    train(tiny_model(), tokens, config(3), tmp_path, language_model_objective(), progress=False)
    path = tmp_path / CHECKPOINT
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:1000])
    elif damage == "garbage":
        path.write_bytes(b"\x80\x04 this is not a checkpoint" * 10)
    else:
        torch.save({"weights": torch.zeros(2)}, path)
    with pytest.raises(ValueError, match=f"checkpoint {path} is corrupt") as info:
        train(tiny_model(), tokens, config(3), tmp_path, language_model_objective(), resume=True,
              progress=False)  # fmt: skip
    assert "weights_only" not in str(info.value)


def test_distill_loss_is_zero_only_for_matching_distributions() -> None:
    logits = torch.randn(2, 5, VOCAB)
    assert distill_loss(logits, logits).abs() < 1e-6
    assert distill_loss(logits + 3.0, logits).abs() < 1e-5  # softmax is shift invariant
    assert distill_loss(torch.randn(2, 5, VOCAB), logits) > 0.1


def test_distillation_pulls_the_student_towards_the_teacher(tmp_path: Path) -> None:
    tokens = periodic_tokens()
    teacher = tiny_model(seed=1, layers=2)
    train(teacher, tokens, config(30), tmp_path / "t", language_model_objective(), progress=False)
    student = tiny_model(seed=2)
    batch = batch_at(tokens, 999, config(1))
    objective = distillation_objective(teacher)
    before = objective(student, batch).item()
    train(student, tokens, config(30), tmp_path / "s", objective, progress=False)
    assert objective(student, batch).item() < 0.5 * before
    assert all(not p.requires_grad for p in teacher.parameters())
