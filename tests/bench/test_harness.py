"""The bench harness: the plan, and `verispec bench` end to end on a tiny pair."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch

from tests.helpers.checkpoints import make_checkpoint, make_perturbed_copy
from verispec.bench.plan import BenchConfig, chain_methods, home_workloads, plan_groups
from verispec.bench.verify_cost import verify_cost_curve
from verispec.cli.bench import bench_config
from verispec.cli.main import build_parser, main
from verispec.drafters.registry import PLAIN, method, takes_draft_model
from verispec.models.kernels.quantization import draft_quantization

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: a second thread only waits
ROW_FIELDS = {
    "engine", "method", "k", "temperature", "top_p", "workload", "concurrency", "tokens_per_s",
    "ttft_s_median", "ttft_s_p90", "itl_s_median", "itl_s_p90", "acceptance_rate",
    "mean_acceptance_length", "per_position_acceptance_rate", "speedup", "predicted_speedup",
    "dtype", "threads", "tpot_s_mean", "decode_speedup",
}  # fmt: skip


def test_plans() -> None:
    config = BenchConfig(Path("t"), Path("d"), ks=(2, 4), temperatures=(0.0, 1.0))
    full = plan_groups(config, home_workloads())
    assert [(g.workload, g.temperature) for g in full] == [
        ("code", 0.0), ("code", 1.0), ("edit", 0.0), ("edit", 1.0), ("free", 1.0)
    ]  # fmt: skip
    assert all(len(g.methods) == 2 * len(chain_methods()) for g in full)  # no head given
    quick = plan_groups(BenchConfig(Path("t"), Path("d"), ks=(4,), plan="quick"), home_workloads())
    for g in quick:
        methods = {m.method for m in g.methods}
        if g.workload == "code":
            assert methods == {m for m in chain_methods() if takes_draft_model(m)}
        if g.workload == "edit":
            assert methods == {m for m in chain_methods() if not takes_draft_model(m)}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"workloads": ("poems",)}, "workload must be one of"),
        ({"methods": ("magic",)}, "method must be one of"),
        ({"engines": ("vllm",)}, "engine must be one of"),
        ({"ks": (0,)}, "k values must be >= 1"),
        ({"top_p": 0.0}, "top_p must be in"),
        ({"repeats": 0}, "repeats and prompts"),
    ],
)
def test_bad_config_is_a_value_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BenchConfig(Path("t"), Path("d"), **kwargs)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> tuple[Path, Path]:
    """A tiny target with a long context (the workload prompts are long) and its perturbed copy."""
    target, draft = tmp_path_factory.mktemp("target"), tmp_path_factory.mktemp("draft")
    model = make_checkpoint(target, "llama", tokenizer, layer_scale=8.0,
                            max_position_embeddings=2048)  # fmt: skip
    make_perturbed_copy(draft, model, tokenizer, 0.03)
    return target, draft


def test_bench_quick_end_to_end(pair: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    target, draft = pair
    out, plots = tmp_path / "bench.json", tmp_path / "plots"
    args = ["bench", "--quick", "--target", str(target), "--draft", str(draft), "--prompts", "2",
            "--max-tokens", "8", "--repeats", "1", "--no-verify-cost", "--json", str(out),
            "--plot", str(plots)]  # fmt: skip
    # The rows are milliseconds long: a full collection of the session's heap (torch,
    # transformers) landing inside one row's draft phase would outweigh the step itself.
    gc.freeze()
    try:
        assert main(args) == 0
    finally:
        gc.unfreeze()
    printed = capsys.readouterr().out
    assert "settings:" in printed and "speedup" in printed
    result = json.loads(out.read_text())
    assert result["settings"]["plan"] == "quick" and result["verify_cost"] == []
    auto = draft_quantization("auto", "auto", torch.device("cpu"), torch.float32, False)
    assert result["settings"]["draft_quantization"] == auto  # w8a8 where VNNI runs it
    assert f"draft_quantization={auto}" in printed
    rows = result["rows"]
    assert {(r["engine"], r["method"]) for r in rows} == {
        (e, m) for e in ("verispec", "transformers") for m in (PLAIN, *chain_methods())
        if e == "verispec" or m == PLAIN or not method(m).own_tree  # suffix: verispec only
    }  # fmt: skip
    assert {r["temperature"] for r in rows} == {0.0, 1.0}
    for r in rows:
        assert ROW_FIELDS <= r.keys()
        assert r["tokens_per_s"] > 0 and r["ttft_s_median"] > 0 and r["tpot_s_mean"] > 0
        assert r["decode_speedup"] > 0 and (r["method"] != PLAIN or r["decode_speedup"] == 1.0)
        if r["engine"] == "verispec":
            shares = r["time_fractions"]
            assert set(shares) == {"draft", "target", "verify", "other"}
            assert sum(shares.values()) == pytest.approx(1.0) and shares["target"] > 0
            if r["method"] != PLAIN and takes_draft_model(r["method"]):
                assert shares["draft"] > 0.01  # a draft model's forwards
            else:
                assert shares["draft"] < 0.5 * shares["target"]  # no model runs there
        else:
            assert r["time_fractions"] is None
        if r["temperature"] == 0:  # every engine and method gives plain greedy's token ids
            assert r["greedy_mismatches"] == 0, r
        if r["method"] != PLAIN and r["engine"] == "verispec":
            assert r["acceptance_rate"] is not None or r["workload"] != "code"
    names = sorted(p.name for p in plots.iterdir())
    assert names == ["acceptance_per_position.png", "speedup_vs_k.png"]  # no curve measured


def test_draft_quantization_option_is_resolved_and_none_means_as_stored() -> None:
    def config(*args: str) -> BenchConfig:
        return bench_config(build_parser().parse_args(["bench", *args]))

    assert config("--draft-quantization", "none").draft_quantization is None
    assert config("--draft-quantization", "q8_0").draft_quantization == "q8_0"
    assert config().draft_quantization in ("w8a8", None)  # auto, by the CPU


def test_bench_bad_options_exit_2(pair: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    target, _ = pair
    assert main(["bench", "--target", str(tmp_path), "--draft", str(target)]) == 2
    assert "no config.json" in capsys.readouterr().err
    assert main(["bench", "--target", str(target), "--draft", str(target), "--k", "0"]) == 2
    assert "k values must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--k", "two"])


def test_verify_cost_curve_shape(pair: tuple[Path, Path]) -> None:
    curve = verify_cost_curve(pair[0], "tiny", qs=(1, 2, 4), context=32, repeats=2)
    assert [p.q for p in curve] == [1, 2, 4] and curve[0].ratio == 1.0
    assert all(p.ms > 0 and p.model == "tiny" for p in curve)
    with pytest.raises(ValueError, match="must include 1"):
        verify_cost_curve(pair[0], "tiny", qs=(2, 4))
