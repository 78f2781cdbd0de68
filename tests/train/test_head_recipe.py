"""The head recipe: padded training windows and their masks, which target distribution each head
row is scored against, the stages end to end on a tiny target (prompts stubbed), run-directory
safety, and `verispec train eagle`'s errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.checkpoints import make_checkpoint
from verispec import LLM, SamplingParams, SpecConfig
from verispec.cli.main import main
from verispec.models.eagle import load_eagle_head, read_eagle_head
from verispec.models.weights.loader import load_model
from verispec.train import head_recipe
from verispec.train.head_recipe import (
    HeadRecipe,
    batch_maker,
    head_scores,
    pad_windows,
    run_head_stage,
)
from verispec.train.trainer import CHECKPOINT, TrainConfig, read_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


def record(ids: list[int], prompt_len: int, width: int = 2, k: int = 2) -> dict[str, Any]:
    """A feature record as extract_features writes it; features/top ids encode the position."""
    t = torch.tensor(ids)
    n = len(ids)
    return {
        "token_ids": t.int(), "prompt_len": prompt_len,
        "features": torch.arange(n * width, dtype=torch.float16).view(n, width),
        "top_ids": torch.stack([t + 100 + j for j in range(k)], dim=1).int(),
        "top_probs": torch.tensor([0.75, 0.25]).expand(n, k).half(),
    }  # fmt: skip


def test_pad_windows_worked_example() -> None:
    """Row t of a window is scored on the distribution of token t + 1; the mask keeps rows
    inside the window whose next token is a response token."""
    a = record([10, 11, 12, 13, 14], prompt_len=2)
    b = record([20, 21, 22], prompt_len=3)
    batch = pad_windows([(a, 1, 5), (b, 0, 3)])
    assert batch["token_ids"].tolist() == [[11, 12, 13, 14], [20, 21, 22, 0]]
    assert batch["mask"].tolist() == [[True] * 4, [False, False, True, False]]
    assert batch["top_ids"][0, :, 0].tolist() == [111, 112, 113, 114]
    assert batch["features"][0, 0].tolist() == [2.0, 3.0]  # position 1 of record a
    assert batch["features"][1, 3].tolist() == [0.0, 0.0]  # padding
    assert batch["top_probs"].dtype == torch.float32 and batch["token_ids"].dtype == torch.int64


def test_batches_are_a_function_of_seed_and_step() -> None:
    records = [record(list(range(3, 3 + n)), prompt_len=2) for n in (5, 9, 30, 12)]
    config = TrainConfig(steps=10, batch_size=3, seq_len=8)
    make = batch_maker(records, config)
    first = make(4)
    assert all(torch.equal(first[key], make(4)[key]) for key in first)
    assert first["token_ids"].shape == (3, 8)  # windows of at most seq_len tokens
    assert any(not torch.equal(first["token_ids"], make(s)["token_ids"]) for s in range(5, 9))
    other = batch_maker(records, TrainConfig(steps=10, batch_size=3, seq_len=8, seed=1))
    assert any(not torch.equal(make(s)["token_ids"], other(s)["token_ids"]) for s in range(4))


class Oracle(torch.nn.Module):
    """A fake head over a draft vocabulary of 128 ids (target id 100 + i -> draft id i) whose
    depth-1 row r puts its mass on the target's top token at window row r + shift."""

    def __init__(self, shift: int) -> None:
        super().__init__()
        to_draft = torch.full((256,), -1)
        to_draft[100:228] = torch.arange(128)
        self.register_buffer("to_draft", to_draft)
        self.shift = shift
        self.top_ids: torch.Tensor | None = None

    def forward(self, token_ids: torch.Tensor, features: torch.Tensor,
                depths: int) -> list[torch.Tensor]:  # fmt: skip
        assert features.shape[-1] == 1  # the recipe's columns, not every stored one
        assert self.top_ids is not None
        b, t = token_ids.shape
        logits = torch.zeros(b, t - 1, 128)
        best = self.top_ids[:, self.shift : self.shift + t - 1, 0] - 100  # [B, T - 1]
        logits.scatter_(2, best.clamp(0, 127)[..., None], 50.0)
        return [logits] * depths


def test_head_row_r_is_scored_on_the_distribution_of_token_r_plus_2() -> None:
    """Row r reads token r + 1 and predicts token r + 2, whose distribution the target gave at
    position r + 1: an oracle reading that row agrees everywhere (and scores a lower loss),
    one reading position r's distribution nowhere."""
    batch = pad_windows([(record([3, 4, 5, 6, 7, 8, 9], prompt_len=2), 0, 7)])
    recipe = HeadRecipe(target="unused", depths=2)
    scores = {}
    for shift in (0, 1):
        oracle = Oracle(shift)
        oracle.top_ids = batch["top_ids"]
        scores[shift] = head_scores(oracle, recipe, slice(1, 2), batch)
    assert scores[1][1] == [1.0, 1.0] and scores[0][1] == [0.0, 0.0]
    assert float(scores[1][0]) < float(scores[0][0])


def test_recipe_validation() -> None:
    with pytest.raises(ValueError, match="prompts must be chat or code, got 'poems'"):
        HeadRecipe(target="t", prompts="poems")
    with pytest.raises(ValueError, match="kind must be one of eagle, medusa, got 'hydra'"):
        HeadRecipe(target="t", kind="hydra")
    recipe = HeadRecipe(target="t", feature_layers=[0, 2], train={"steps": 5, "seq_len": 64})
    assert recipe.feature_layers == (0, 2)
    assert isinstance(recipe.train, TrainConfig) and recipe.train.steps == 5


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> Path:
    path = tmp_path_factory.mktemp("head-recipe-target")
    make_checkpoint(path, "llama", tokenizer, layer_scale=8.0)
    return path


def tiny_recipe(target: Path, **changes: Any) -> HeadRecipe:
    steps = TrainConfig(steps=3, batch_size=2, seq_len=32, lr=1e-2, warmup_steps=1,
                        checkpoint_every=2, bf16=False)  # fmt: skip
    settings: dict[str, Any] = dict(
        target=str(target), prompts="code", num_prompts=6, num_heldout=2, max_tokens=8,
        draft_vocab_size=200, top_k=4, depths=2, train=steps,
    )  # fmt: skip
    return HeadRecipe(**{**settings, **changes})


@pytest.fixture
def stub_prompts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Short token-id prompts instead of the source-file prompt set (fast, fits 256 tokens)."""

    def prompts(recipe: HeadRecipe, llm: LLM, split: str) -> list[list[int]]:
        n = recipe.num_prompts if split == "train" else recipe.num_heldout
        base = 3 if split == "train" else 150
        return [[0, base + i, base + 2 * i + 1, 40 + i] for i in range(n)]

    monkeypatch.setattr(head_recipe, "training_prompts", prompts)


@pytest.mark.usefixtures("stub_prompts")
def test_stages_end_to_end(target: Path, tmp_path: Path) -> None:
    """data -> train -> export: a head the engine loads and drafts with losslessly."""
    recipe = tiny_recipe(target)
    run_head_stage("data", tmp_path, recipe, resume=False, progress=False)
    assert len(list((tmp_path / "responses").rglob("responses-*.jsonl"))) == 2  # greedy, sampled
    assert len(torch.load(tmp_path / "features" / "features-00000.pt")) == 6
    assert len(torch.load(tmp_path / "heldout" / "features" / "features-00000.pt")) == 2
    for stage in ("train", "export"):
        run_head_stage(stage, tmp_path, recipe, resume=True, progress=False)
    report_losses = read_checkpoint(tmp_path / "head" / CHECKPOINT)["state"]["losses"]
    assert len(report_losses) == 3
    report = json.loads((tmp_path / "export" / "eval.json").read_text())
    assert report["steps"] == 3 and len(report["heldout_top1_agreement"]) == 2
    head = load_eagle_head(tmp_path / "export", load_model(target, torch.float32,
                           torch.device("cpu"), "torch"), "torch")  # fmt: skip
    assert head.config.draft_vocab_size == 200
    run_head_stage("train", tmp_path, recipe, resume=True, progress=False)  # already done
    assert read_checkpoint(tmp_path / "head" / CHECKPOINT)["state"]["losses"] == report_losses
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    spec = SpecConfig(method="eagle", model=str(tmp_path / "export"), num_speculative_tokens=3,
                      tree_topk=2)  # fmt: skip
    prompts = [[0, 7, 8, 9], [0, 30]]
    out = LLM(model=str(target), speculative=spec, batch_invariant=True).generate(prompts, params)
    plain = LLM(model=str(target), speculative=None, batch_invariant=True)
    assert [o.token_ids for o in out] == [o.token_ids for o in plain.generate(prompts, params)]
    config = load_model(target, torch.float32, torch.device("cpu"), "torch").config
    eagle3 = read_eagle_head(tmp_path / "export", config)
    run_head_stage("export", tmp_path, recipe, resume=True, progress=False,
                   head_format="speculators")  # fmt: skip
    spec = json.loads((tmp_path / "export" / "config.json").read_text())["speculators_config"]
    assert spec["verifier"] == {"name_or_path": str(target), "architectures": ["LlamaForCausalLM"]}
    assert spec["proposal_methods"][0]["speculative_tokens"] == recipe.depths
    speculators = read_eagle_head(tmp_path / "export", config)
    assert speculators[0] == eagle3[0] and speculators[1].keys() == eagle3[1].keys()
    assert all(torch.equal(t, eagle3[1][name]) for name, t in speculators[1].items())


def test_head_formats_are_checked_before_any_stage(target: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="head format must be one of eagle3, speculators; got "
                       "'gguf'"):  # fmt: skip
        run_head_stage("data", tmp_path, tiny_recipe(target), False, head_format="gguf")
    with pytest.raises(ValueError, match="the speculators format holds EAGLE-3 heads; medusa"):
        run_head_stage("data", tmp_path, tiny_recipe(target, kind="medusa"), False,
                       head_format="speculators")  # fmt: skip
    assert not any(tmp_path.iterdir())


def test_a_run_directory_keeps_its_recipe(target: Path, tmp_path: Path) -> None:
    """Another recipe in the same directory is refused; so is a second fresh run over a head
    that was trained there (only --resume continues it)."""
    with pytest.raises(ValueError, match=r"stage must be one of data, train, export; got 'eval'"):
        run_head_stage("eval", tmp_path, tiny_recipe(target), resume=False, progress=False)
    check = head_recipe._check_recipe
    check(tmp_path, tiny_recipe(target, max_tokens=9), resume=False)  # writes recipe.json
    with pytest.raises(ValueError, match=r"holds a run with other settings \(\['max_tokens'\]\)"):
        run_head_stage("train", tmp_path, tiny_recipe(target), resume=True, progress=False)
    (tmp_path / "head").mkdir()
    with pytest.raises(ValueError, match="already holds a run; pass --resume to continue it"):
        check(tmp_path, tiny_recipe(target, max_tokens=9), resume=False)
    check(tmp_path, tiny_recipe(target, max_tokens=9), resume=True)


@pytest.mark.usefixtures("stub_prompts")
def test_cli_trains_a_head_in_a_fresh_directory(target: Path, tmp_path: Path, capsys) -> None:
    args = ["train", "eagle", "--target", str(target), "--out", str(tmp_path / "run"),
            "--num-prompts", "4", "--max-tokens", "6", "--steps", "2", "--draft-vocab", "100",
            "--threads", "1"]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err
    assert (tmp_path / "run" / "export" / "config.json").is_file()


@pytest.mark.usefixtures("stub_prompts")
def test_cli_runs_one_stage_with_only(target: Path, tmp_path: Path, capsys) -> None:
    """--only runs that stage alone: data leaves no head, export of a partial run works."""
    run = tmp_path / "run"
    args = ["train", "eagle", "--target", str(target), "--out", str(run), "--num-prompts", "4",
            "--max-tokens", "6", "--steps", "4", "--batch-size", "2", "--draft-vocab", "100",
            "--threads", "1", "--device", "cpu"]  # fmt: skip
    assert main([*args, "--only", "data"]) == 0, capsys.readouterr().err
    assert (run / "features").is_dir() and not (run / "head").exists()
    assert main([*args, "--only", "train"]) == 0, capsys.readouterr().err
    assert read_checkpoint(run / "head" / CHECKPOINT)["config"]["batch_size"] == 2
    assert not (run / "export").exists()
    assert main([*args, "--only", "export"]) == 0, capsys.readouterr().err
    assert json.loads((run / "export" / "eval.json").read_text())["steps"] == 4
    assert main([*args, "--only", "export", "--format", "speculators"]) == 0
    config = json.loads((run / "export" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "eagle"], "verispec train eagle needs --target"),
        (["train", "eagle", "--target", "/no/such/model"], "does not exist"),
        (["train", "target", "--steps", "3"], "--steps apply to 'verispec train eagle"),
        (["train", "eagle", "--target", "TARGET", "--num-prompts", "0"],
         "--num-prompts must be >= 1, got 0"),
        (["train", "eagle", "--target", "TARGET", "--batch-size", "0"],
         "--batch-size must be >= 1, got 0"),
        (["train", "eagle", "--target", "TARGET", "--device", "tpu"],
         "device must be auto, cpu, cuda or cuda:N; got 'tpu'"),
        (["train", "target", "--device", "cpu"], "--device apply to 'verispec train eagle"),
        (["train", "target", "--format", "eagle3"], "--format apply to 'verispec train eagle"),
        (["train", "medusa", "--target", "TARGET", "--format", "speculators"],
         "the speculators format holds EAGLE-3 heads; medusa heads are written in their own"),
    ],
    ids=["no-target", "missing-target", "steps-for-target", "zero-prompts", "zero-batch",
         "bad-device", "device-for-target", "format-for-target", "speculators-medusa"],
)  # fmt: skip
def test_cli_errors_exit_2_with_one_line(
    args: list[str], message: str, target: Path, tmp_path: Path, capsys
) -> None:
    argv = [str(target) if a == "TARGET" else a for a in args] + ["--out", str(tmp_path)]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("verispec: error: ") and err.count("\n") == 1, err
    assert message in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message of a machine without CUDA")
def test_cli_asks_for_cuda_on_a_machine_without_it(target: Path, tmp_path: Path, capsys) -> None:
    argv = ["train", "eagle", "--target", str(target), "--out", str(tmp_path), "--device", "cuda"]
    assert main(argv) == 2
    assert "device 'cuda' was asked for but no CUDA device is available" in capsys.readouterr().err
