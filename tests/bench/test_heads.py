"""The bench with feature-level drafters: --eagle/--medusa heads, chains and draft trees, the
row shape fields, the step-cost prediction, and every bad option refused with a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers.checkpoints import make_checkpoint
from verispec.bench.engines import MethodSpec, TreeShape, parse_tree_shape
from verispec.bench.plan import BenchConfig, chain_methods, home_workloads, plan_groups
from verispec.bench.report import shape, table
from verispec.bench.verify_cost import PassTimes, step_cost_ratio, step_predicted_speedup
from verispec.cli.main import main
from verispec.drafters.registry import PLAIN
from verispec.models.eagle import EagleConfig, save_eagle_head
from verispec.models.medusa import MedusaConfig, save_medusa_heads
from verispec.models.weights.loader import load_model
from verispec.train.eagle import TrainableEagle
from verispec.train.medusa import TrainableMedusa

MEDUSA_HEADS = 3
SHAPE_FIELDS = {"k", "tree_topk", "tree_depth", "budget", "step_cost_ratio", "predicted_speedup"}


def test_tree_shapes_parse_and_are_checked() -> None:
    assert parse_tree_shape(" 4x6:16") == TreeShape(4, 6, 16)
    assert parse_tree_shape("2x4:8").label == "2x4:8"
    grafted = parse_tree_shape("3x4:8+4")
    assert (grafted, grafted.nodes, grafted.label) == (TreeShape(3, 4, 8, 4), 12, "3x4:8+4")
    for text in ("4x6", "4:16", "ax6:16", "4x6:16:2", "", "3x4:8+", "3x4:8+x"):
        with pytest.raises(ValueError, match="KxD:N"):
            parse_tree_shape(text)
    for text in ("1x6:16", "4x0:16", "4x6:0", "4x6:65", "3x4:8+0", "3x4:60+5"):
        with pytest.raises(ValueError, match=r"topk K >= 2 .* N \+ L <= 64"):
            parse_tree_shape(text)


def test_shape_fitted_to_a_drafter_depth() -> None:
    tree = MethodSpec("medusa", 16, tree=TreeShape(4, 6, 16))
    assert tree.fitted(3) == MethodSpec("medusa", 16, tree=TreeShape(4, 3, 16))
    assert tree.fitted(None) == tree and tree.fitted(8) == tree and tree.label == "4x6:16"
    assert MethodSpec("medusa", 8).fitted(3) == MethodSpec("medusa", 3)


def test_step_cost_worked_example() -> None:
    plain = PassTimes(forward_s=2.0, prefill_s=0.08, decode_tokens=96, verify_steps=0, accepted=0)
    spec = PassTimes(forward_s=1.0, prefill_s=0.08, decode_tokens=96, verify_steps=30, accepted=60)
    ratio = step_cost_ratio(spec, plain)
    assert ratio == pytest.approx((1.0 - 0.08 - 6 * 0.02) / 30 / 0.02)
    assert step_predicted_speedup(3.0, ratio) == pytest.approx(3.0 / ratio)
    assert step_cost_ratio(PassTimes(1.0, 0.1, 10, 0, 0), plain) is None  # nothing verified
    assert step_cost_ratio(PassTimes(0.05, 0.08, 96, 30, 60), plain) is None  # too short
    assert step_predicted_speedup(None, 1.2) is None and step_predicted_speedup(2.0, None) is None


def test_step_cost_from_steps_timed_by_kind() -> None:
    """A pass's own plain decode steps, when it has enough, else the plain pass's: drift between
    passes (here the plain pass ran 10% slower) stays out of the ratio."""
    plain = PassTimes(2.0, 0.08, 96, 0, 0, decode_steps=95, decode_s=95 * 0.0096)
    spec = PassTimes(5.33, 0.43, 702, 93, 180, decode_steps=431, decode_s=3.763,
                     verify_timed=93, verify_s=1.063)  # fmt: skip
    assert step_cost_ratio(spec, plain) == pytest.approx(1.063 / 93 / (3.763 / 431))  # 1.31
    few = PassTimes(1.0, 0.08, 96, 30, 60, decode_steps=5, decode_s=0.04,
                    verify_timed=30, verify_s=0.84)  # fmt: skip
    assert step_cost_ratio(few, plain) == pytest.approx(0.84 / 30 / 0.0096)
    untimed = PassTimes(1.0, 0.08, 96, 30, 60)  # an engine that kept no kinds: phase totals
    assert step_cost_ratio(untimed, plain) == pytest.approx((1.0 - 0.08 - 6 * t1(plain)) / 30
                                                            / t1(plain))  # fmt: skip


def t1(plain: PassTimes) -> float:
    return (plain.forward_s - plain.prefill_s) / plain.decode_tokens


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"methods": ("eagle",)}, "method eagle needs a head directory: give --eagle PATH"),
        ({"methods": ("medusa",), "heads": {"eagle": Path("h")}}, "give --medusa PATH"),
        ({"methods": ("ngram",), "heads": {"eagle": Path("h")}}, "--eagle is given but eagle"),
        ({"methods": ("ngram",), "heads": {"ngram": Path("h")}}, "heads are for eagle, medusa"),
        ({"methods": ("ngram",), "trees": (TreeShape(2, 2, 4),)}, "--trees applies to eagle"),
    ],
)
def test_bad_head_config_is_a_value_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BenchConfig(Path("t"), Path("d"), **kwargs)


def test_plan_runs_trees_for_head_methods_only() -> None:
    tree = TreeShape(4, 6, 16)
    config = BenchConfig(Path("t"), Path("d"), methods=("ngram", "eagle"), ks=(2, 4),
                         heads={"eagle": Path("h")}, trees=(tree,), temperatures=(0.0,),
                         workloads=("code",))  # fmt: skip
    (group,) = plan_groups(config, home_workloads())
    assert group.methods == (
        MethodSpec("ngram", 2), MethodSpec("ngram", 4),
        MethodSpec("eagle", 2), MethodSpec("eagle", 4), MethodSpec("eagle", 16, tree=tree),
    )  # fmt: skip
    assert "eagle" not in chain_methods() and home_workloads()["eagle"] == "code"


def test_table_shows_the_shape() -> None:
    row = {"method": "eagle", "k": 16, "tree_topk": 4, "tree_depth": 6, "budget": 16}
    assert shape(row) == "4x6:16" and shape({**row, "tree_topk": None}) == "16"
    assert "4x6:16" in table([row]).splitlines()[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> tuple[Path, Path, Path]:
    """(target, eagle head, medusa heads): a tiny Llama with a long context (the workload prompts
    are long) and random heads for it (Medusa: 3 heads, starting as the target's LM head)."""
    target = tmp_path_factory.mktemp("target")
    make_checkpoint(target, "llama", tokenizer, layer_scale=8.0, max_position_embeddings=2048)
    model = load_model(target, torch.float32, torch.device("cpu"), "torch")
    vocab = model.config.vocab_size
    draft_ids = torch.arange(vocab)
    lm_head = model.lm_head.weight.detach()
    torch.manual_seed(0)
    eagle_config = EagleConfig.for_target(model.config, vocab, None)
    eagle = TrainableEagle(eagle_config, model.embed, draft_ids, lm_head_init=lm_head)
    eagle_dir = tmp_path_factory.mktemp("eagle")
    save_eagle_head(eagle_config, eagle.state_for_export(), eagle_dir, torch.float32)
    medusa_config = MedusaConfig(MEDUSA_HEADS, model.config.hidden_size, vocab, vocab)
    medusa = TrainableMedusa(medusa_config, model.final_norm, model.config.rms_norm_eps,
                             draft_ids, lm_head)  # fmt: skip
    medusa_dir = tmp_path_factory.mktemp("medusa")
    save_medusa_heads(medusa_config, medusa.state_for_export(), medusa_dir, torch.float32)
    return target, eagle_dir, medusa_dir


def test_bench_eagle_and_medusa_chains_and_trees(
    tiny: tuple[Path, Path, Path], tmp_path: Path, capsys
) -> None:
    target, eagle, medusa = tiny
    out = tmp_path / "bench.json"
    args = ["bench", "--target", str(target), "--engines", "verispec", "--workloads", "code",
            "--methods", "none,eagle,medusa", "--eagle", str(eagle), "--medusa", str(medusa),
            "--k", "2", "--trees", "2x4:6,2x4:4+2", "--temperatures", "0", "--prompts", "1",
            "--max-tokens", "16", "--repeats", "1", "--threads", "1", "--no-verify-cost",
            "--json", str(out)]  # fmt: skip
    assert main(args) == 0
    captured = capsys.readouterr()
    assert f"eagle={eagle}" in captured.out and f"medusa={medusa}" in captured.out
    assert "trees=2x4:6,2x4:4+2" in captured.out
    assert "medusa 2x4:6 runs as 2x3:6" in captured.err  # one head per level
    lines = captured.out.splitlines()
    assert any(" eagle " in x and " 2x4:6 " in x for x in lines)
    assert any(" eagle " in x and " 2x4:4+2 " in x for x in lines)  # grafted: eagle only
    result = json.loads(out.read_text())
    assert result["settings"]["heads"] == {"eagle": str(eagle), "medusa": str(medusa)}
    rows = {(r["method"], r["tree_topk"], r["tree_depth"], r["budget"], r["k"]): r
            for r in result["rows"]}  # fmt: skip
    assert set(rows) == {
        (PLAIN, None, None, None, 0), ("eagle", None, None, None, 2), ("eagle", 2, 4, 6, 6),
        ("eagle", 2, 4, 4, 6), ("medusa", None, None, None, 2), ("medusa", 2, MEDUSA_HEADS, 6, 6),
    }  # fmt: skip
    for key, r in rows.items():
        assert SHAPE_FIELDS <= r.keys()
        assert r["greedy_mismatches"] == 0, key  # lossless: plain greedy's ids
        if key[0] != PLAIN:
            assert r["mean_acceptance_length"] >= 1.0  # it verified drafts
            assert len(r["per_position_acceptance_rate"]) <= (key[2] or key[4])
            assert r["draft_cost_ratio"] is None  # a head has no draft model to time alone


def test_bench_bad_head_options_exit_2(
    tiny: tuple[Path, Path, Path], tmp_path: Path, capsys
) -> None:
    target, eagle, _ = tiny
    base = ["bench", "--target", str(target), "--no-verify-cost"]
    cases = [
        (["--methods", "none,eagle"], "method eagle needs a head directory: give --eagle PATH"),
        (["--eagle", str(tmp_path / "missing")], "--eagle "),
        (["--medusa", str(tmp_path)], f"--medusa {tmp_path}: drafter head directory"),
        (["--eagle", str(eagle), "--trees", "4x6"], "tree shape must be KxD:N"),
        (["--eagle", str(eagle), "--trees", "1x6:16"], "topk K >= 2"),
        (["--methods", "ngram", "--trees", "2x2:4"], "--trees applies to eagle and medusa"),
    ]
    for extra, message in cases:
        assert main([*base, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith("verispec: error: ") and message in err, (extra, err)
        assert len(err.strip().splitlines()) == 1  # one line, no traceback
