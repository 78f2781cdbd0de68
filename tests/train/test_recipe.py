"""The whole training recipe end to end on a small corpus with tiny shapes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from verispec import LLM, SamplingParams
from verispec.cli.main import main
from verispec.data.corpus import stdlib_root
from verispec.train.recipe import (
    STAGES,
    ModelShape,
    Recipe,
    build_model,
    init_from_target,
    load_stage_model,
    load_tokenizer,
    run_stage,
)
from verispec.train.trainer import TrainConfig


def tiny_recipe(corpus: Path) -> Recipe:
    steps = dict(batch_size=2, seq_len=64, warmup_steps=1, checkpoint_every=2)
    return Recipe(
        vocab_size=400,
        target=ModelShape(64, 128, 2, 4, 2, context_length=512),
        draft=ModelShape(64, 128, 1, 4, 2, context_length=512),
        draft_init_layers=(1,),
        target_train=TrainConfig(steps=4, seed=1, **steps),
        draft_train=TrainConfig(steps=3, seed=2, **steps),
        corpus_root=str(corpus),
        eval_prompts=3,
        eval_max_tokens=8,
    )  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few real standard-library modules, two of them from the held-out list."""
    root, src = tmp_path_factory.mktemp("stdlib"), stdlib_root()
    for name in ("abc.py", "bisect.py", "colorsys.py", "keyword.py", "textwrap.py", "this.py"):
        shutil.copy(src / name, root / name)
    return root


@pytest.fixture(scope="module")
def run(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("run")
    for stage in STAGES:
        run_stage(stage, run_dir, tiny_recipe(corpus), resume=False, progress=False)
    return run_dir


def test_export_is_a_fp16_hugging_face_checkpoint(run: Path) -> None:
    for which in ("target", "draft"):
        path = run / "export" / which
        names = {p.name for p in path.iterdir()}
        assert {"config.json", "model.safetensors", "tokenizer.json",
                "generation_config.json"} <= names  # fmt: skip
        with safe_open(str(path / "model.safetensors"), "pt") as f:
            assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(str(path))
        ids = tok("def f(x):\n    return x\n", return_tensors="pt").input_ids
        assert ids[0, 0].item() == tok.bos_token_id == model.config.bos_token_id
        expected = model(ids).logits[0, -1]
        llm = LLM(model=str(path), dtype="float32")
        (out,) = llm.generate(ids[0].tolist(), SamplingParams(temperature=0.0, max_tokens=1))
        assert out.token_ids[0] == int(expected.argmax())


def test_eval_report_has_losses_acceptance_and_samples(run: Path) -> None:
    report = json.loads((run / "export" / "eval.json").read_text())
    for which, steps in (("target", 4), ("draft", 3)):
        assert report[which]["train_steps"] == steps
        assert 0 < report[which]["heldout_loss"] < 10 and report[which]["heldout_tokens"] > 100
    acc = report["acceptance"]
    assert acc["k"] == 4 and acc["prompts"] == 3 and acc["num_draft_tokens"] > 0
    assert 0 <= acc["acceptance_rate"] <= 1 and len(acc["per_position_acceptance_rate"]) == 4
    assert len(report["samples"]) == 3 and all(s["prompt"] for s in report["samples"])
    recipe = json.loads((run / "export" / "recipe.json").read_text())
    assert recipe["target"]["hidden_size"] == 64


def test_draft_starts_from_the_target_layers(run: Path, corpus: Path) -> None:
    recipe = tiny_recipe(corpus)
    target = load_stage_model(run, recipe, "target")
    draft = build_model(recipe.draft, load_tokenizer(run), seed=5)
    init_from_target(draft, target, (1,))
    copied = target.model.layers[1].state_dict()
    for name, tensor in draft.model.layers[0].state_dict().items():
        assert torch.equal(tensor, copied[name]), name
    assert torch.equal(draft.model.norm.weight, target.model.norm.weight)
    assert torch.equal(draft.lm_head.weight, target.model.embed_tokens.weight)  # tied
    with pytest.raises(ValueError, match="names 2 layers"):
        init_from_target(draft, target, (0, 1))
    with pytest.raises(ValueError, match="cannot initialise"):
        init_from_target(draft, target, (7,))


def test_rerunning_a_stage_needs_resume(run: Path, corpus: Path) -> None:
    with pytest.raises(ValueError, match="--resume"):
        run_stage("target", run, tiny_recipe(corpus), resume=False, progress=False)
    run_stage("target", run, tiny_recipe(corpus), resume=True, progress=False)  # already done


def test_cli_train_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "draft", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "run the tokenizer stage first" in err and "Traceback" not in err
    assert main(["train", "target", "--out", str(tmp_path), "--threads", "0"]) == 2
    assert "--threads must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "nonsense", "--out", str(tmp_path)])
