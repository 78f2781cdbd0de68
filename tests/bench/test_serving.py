"""`verispec bench --serving`: the HTTP concurrency sweep runs every setting at every
concurrency through real servers, and its rows, table, plot and errors say what they should."""

from __future__ import annotations

import pytest

from verispec.bench.serving import ServingConfig, plot, run_sweep, spec_for, table
from verispec.cli.main import main
from verispec.spec.resolve import resolve_speculative

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_small_sweep_through_http(tmp_path) -> None:
    config = ServingConfig(model="embedded-code", settings=("off", "auto", "k2"),
                           concurrency=(1, 2), requests=2, max_tokens=8, repeats=2)  # fmt: skip
    rows = run_sweep(config, log=lambda _: None)
    assert [(r.concurrency, r.setting) for r in rows] == [
        (1, "off"), (1, "auto"), (1, "k2"), (2, "off"), (2, "auto"), (2, "k2")
    ]  # fmt: skip
    for r in rows:
        assert r.requests == 4 and r.output_tokens == 32 and r.throughput > 0  # 2 rounds
        assert len(r.extra["round_tokens_per_s"]) == 2
        assert r.extra["workload"] == "code"  # embedded-code has no chat template
        assert r.ttft_p50_s <= r.ttft_p90_s and r.goodput_rps >= 0
    off = [r for r in rows if r.setting == "off"]
    k2 = [r for r in rows if r.setting == "k2"]
    assert all(r.ratio_to_off == 1.0 and r.acceptance_rate is None for r in off)
    assert all(r.acceptance_rate is not None and r.tokens_per_step >= 1 for r in k2)
    text = table(rows, config)
    assert "code workload" in text and len(text.splitlines()) == 2 + len(rows)
    assert plot(rows, tmp_path / "sweep.png").stat().st_size > 0


def test_settings_name_what_they_run() -> None:
    assert spec_for("off", "embedded-code") is None
    assert spec_for("auto", "embedded-code") == resolve_speculative("embedded-code", "auto")
    assert spec_for("auto", "embedded-code").adaptive
    assert spec_for("k3", "embedded-code").num_speculative_tokens == 3
    assert not spec_for("fixed", "embedded-code").adaptive
    with pytest.raises(ValueError, match="allowed: off, auto, fixed, kN"):
        spec_for("fast", "embedded-code")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--methods", "ngram"], "--methods do not apply to --serving"),
        (["--requests", "0"], "--requests must be >= 1"),
        (["--url", "http://127.0.0.1:9", "--settings", "off,auto"], "one running server"),
    ],
)
def test_bad_serving_options_exit_2(args, message, capsys) -> None:
    assert main(["bench", "--serving", "--target", "embedded-code", *args]) == 2
    assert message in capsys.readouterr().err
