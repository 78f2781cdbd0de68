"""`verispec verify` on a local engine: exact configurations pass, a deliberately broken verifier
is caught (greedy and sampling), the per-request switch it relies on really turns drafting off,
and bad usage exits 2 with one line."""

from __future__ import annotations

import doctest
import importlib
import json
from pathlib import Path

import pytest
import torch

from tests.helpers.audit import (
    accept_every_greedy_draft,
    keep_every_draft,
    make_sharp_pair,
    write_jsonl,
)
from verispec import LLM, SamplingParams, SpecConfig
from verispec.audit.report import DIFFERS, IDENTICAL, NEAR_TIE, greedy_prompt
from verispec.cli.main import main
from verispec.engine import runner
from verispec.sample import rejection

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["def add(a, b):", "for i in range(10):", "class Point:", "import os"]


@pytest.fixture(scope="module")
def far_pair(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> tuple[Path, Path]:
    """(target, draft): a tiny Llama whose next-token entropy is about 2 nats (its output layer
    scaled by HEAD_SCALE), and a copy with 0.05 std of noise per matrix: about 40% of sampled
    drafts accepted, and q far enough from p that a verifier emitting q is caught."""
    return make_sharp_pair(tmp_path_factory, "verify", tokenizer, noise=0.05)


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("verify-prompts") / "prompts.jsonl"
    return write_jsonl(path, ({"id": f"p{i}", "prompt": p} for i, p in enumerate(PROMPTS)))


def audit(pair: tuple[Path, Path], prompts: Path, tmp_path: Path, *extra: str) -> tuple[int, dict]:
    """Run `verispec verify` on the pair (draft_model, k = 3); exit status and JSON report."""
    out = tmp_path / "report.json"
    code = main(["verify", "--model", str(pair[0]), "--draft", str(pair[1]), "--k", "3",
                 "--prompts", str(prompts), "--json", str(out), *extra])  # fmt: skip
    return code, json.loads(out.read_text())


def _accept_all(ok: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Broken: every draft is accepted, whatever the target says (output follows the draft)."""
    return torch.tensor(counts, dtype=torch.int64, device=ok.device)


def test_greedy_exact_in_batch_invariant_mode(far_pair, prompts_file, tmp_path, capsys) -> None:
    code, report = audit(far_pair, prompts_file, tmp_path, "--batch-invariant",
                          "--max-tokens", "24")  # fmt: skip
    assert code == 0, capsys.readouterr().out
    assert report["verdict"] == "exact" and report["exit_code"] == 0
    assert [p["result"] for p in report["greedy"]] == [IDENTICAL] * len(PROMPTS)
    assert all(p["tokens"] == 24 for p in report["greedy"])
    assert 0 < report["accepted_tokens"] < report["draft_tokens"]  # some drafts rejected
    out = capsys.readouterr().out
    assert "verdict: EXACT" in out and "batch-invariant: True" in out


def test_greedy_catches_a_verifier_that_accepts_every_draft(
    far_pair, prompts_file, tmp_path, capsys, monkeypatch
) -> None:
    monkeypatch.setattr(runner, "verify_greedy", accept_every_greedy_draft)
    code, report = audit(far_pair, prompts_file, tmp_path, "--max-tokens", "24")
    assert code == 1
    assert report["verdict"] == "not exact"
    differs = [p for p in report["greedy"] if p["result"] == DIFFERS]
    assert differs and all(p["first_difference"] is not None for p in differs)
    # the draft's tokens are no near ties of the target: far below its top, or not near it
    assert all(p["gap"] is None or p["gap"] > 1e-3 for p in differs)
    assert "DIFFERS (a real divergence)" in capsys.readouterr().out


def test_sampling_exact(far_pair, prompts_file, tmp_path, capsys) -> None:
    code, report = audit(far_pair, prompts_file, tmp_path, "--temperature", "1.0",
                          "--top-k", "20", "--num-prompts", "2", "--samples", "800")  # fmt: skip
    assert code == 0, capsys.readouterr().out
    assert report["mode"] == "sampling" and len(report["sampling"]) == 2
    for p in report["sampling"]:
        assert p["passed"] and p["impossible"] == 0
        assert p["verified"] == p["samples"] == 800  # every second token went through drafts
        assert p["dof"] >= 5 and p["tv"] <= p["tv_limit"]
        assert p["threshold"] == pytest.approx(0.01 / 4)  # alpha / (2 prompts)


@pytest.mark.parametrize("broken", ["rejection", "coupled"])
def test_sampling_catches_a_verifier_that_emits_the_drafts(
    far_pair, prompts_file, tmp_path, monkeypatch, broken: str
) -> None:
    """Accepting every draft makes the second token follow q, not p (the seeds are fixed, so
    this is deterministic). Half the audit's requests are seeded (verified by coupling) and
    half are not (rejection sampling, docs/design.md, 3): breaking either rule alone fails."""
    if broken == "rejection":
        monkeypatch.setattr(rejection, "_accepted_prefix", _accept_all)
    else:
        monkeypatch.setattr(rejection, "_keep_matching", keep_every_draft)
    code, report = audit(far_pair, prompts_file, tmp_path, "--temperature", "1.0",
                          "--num-prompts", "2", "--samples", "800")  # fmt: skip
    assert code == 1 and report["verdict"] == "not exact"
    assert all(not p["passed"] and p["p_value"] < 1e-6 for p in report["sampling"])


@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed-k", "adaptive"])
def test_the_per_request_switch_turns_drafting_off(far_pair, adaptive: bool) -> None:
    """Speculative and plain requests in one batch: the plain ones verify no draft at all, and
    their greedy output is the engine's plain output."""
    spec = SpecConfig(method="draft_model", model=str(far_pair[1]), num_speculative_tokens=3,
                      adaptive=adaptive)  # fmt: skip
    llm = LLM(model=str(far_pair[0]), speculative=spec, batch_invariant=True)
    on = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    off = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, speculative=False)
    outs = llm.generate(PROMPTS * 2, [on] * len(PROMPTS) + [off] * len(PROMPTS))
    drafted = [o.metrics.spec.num_draft_tokens for o in outs]
    assert all(d == 0 for d in drafted[len(PROMPTS) :])
    if not adaptive:  # the policy may choose no drafts; fixed k always drafts
        assert all(d > 0 for d in drafted[: len(PROMPTS)])
    plain = LLM(model=str(far_pair[0]), speculative=None, batch_invariant=True)
    reference = plain.generate(PROMPTS, on)
    for a, b, c in zip(outs[: len(PROMPTS)], outs[len(PROMPTS) :], reference, strict=True):
        assert a.token_ids == b.token_ids == c.token_ids


def test_speculative_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="speculative must be True or False"):
        SamplingParams(speculative="no")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["fit", "report", "distribution", "prompts"])
def test_worked_examples(name: str) -> None:
    """The docstrings' worked examples hold."""
    assert doctest.testmod(importlib.import_module(f"verispec.audit.{name}")).failed == 0


def test_greedy_classification() -> None:
    """A near tie needs the speculative token within tolerance of the plain top logit."""
    top = [[(5, -0.1), (6, -2.0)], [(7, -0.6931), (8, -0.6932), (9, -0.6932)], [(1, -0.1)]]
    assert greedy_prompt("p", [5, 7, 1], [5, 7, 1], top, 1e-3, False).result == IDENTICAL
    tie = greedy_prompt("p", [5, 8, 3], [5, 7, 1], top, 1e-3, False)
    assert (tie.result, tie.first_difference, tie.tokens) == (NEAR_TIE, 1, 1)
    assert tie.margin == tie.gap == pytest.approx(1e-4)
    third = greedy_prompt("p", [5, 9], [5, 7], top, 1e-3, False)  # tied with the runner-up
    assert third.result == NEAR_TIE
    absent = greedy_prompt("p", [5, 4], [5, 7], top, 1.0, False)  # not among the plain top
    assert (absent.result, absent.gap) == (DIFFERS, None)
    assert greedy_prompt("p", [6, 7], [5, 7], top, 10.0, False).result == NEAR_TIE
    assert greedy_prompt("p", [6, 7], [5, 7], top, 1.0, False).result == DIFFERS  # gap 1.9
    assert greedy_prompt("p", [5, 8], [5, 7], top, 1.0, True).result == DIFFERS  # strict
    assert greedy_prompt("p", [5, 7], [5, 7, 1], top, 1.0, False).result == DIFFERS  # shorter


BAD_USAGE: list[tuple[list[str], str]] = [
    (["--method", "none"], "nothing to verify"),
    (["--samples", "5", "--temperature", "1"], "--samples must be >= 20"),
    (["--alpha", "1.5", "--temperature", "1"], "--alpha must be in (0, 1)"),
    (["--tie-tolerance", "-1"], "--tie-tolerance must be >= 0"),
    (["--num-prompts", "0"], "--num-prompts must be >= 1"),
    (["--threads", "0"], "--threads must be >= 1"),
    (["--server", "http://127.0.0.1:9", "--k", "2"], "drop --k"),
    (["--server", "ftp://x"], "--server must be an http(s) URL"),
    (["--server", "http://127.0.0.1:9"], "cannot reach"),
    (["--json", "/no/such/dir/r.json"], "does not exist"),
]


@pytest.mark.parametrize(("args", "message"), BAD_USAGE, ids=[m for _, m in BAD_USAGE])
def test_bad_usage_exits_2_with_one_line(llama_checkpoint, capsys, args, message) -> None:
    model = [] if "--server" in args else ["--model", str(llama_checkpoint)]
    assert main(["verify", *model, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("verispec: error:") and message in err and err.count("\n") == 1


PROMPT_FILES: list[tuple[str, str]] = [
    ("not json\n", "line 1"),
    ('{"text": "x"}\n', '"prompt" (text) or "messages"'),
    ('{"prompt": ""}\n', "non-empty text"),
    ("\n\n", "holds no prompt"),
    ('{"messages": [{"role": "user", "content": "hi"}]}\n', "no chat template"),
]


@pytest.mark.parametrize(("content", "message"), PROMPT_FILES, ids=[m for _, m in PROMPT_FILES])
def test_bad_prompt_files_exit_2(llama_checkpoint, tmp_path, capsys, content, message) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(content)
    assert main(["verify", "--model", str(llama_checkpoint), "--method", "ngram",
                 "--prompts", str(path)]) == 2  # fmt: skip
    err = capsys.readouterr().err  # the last check needs the tokenizer: after "loading ..."
    last = err.strip().splitlines()[-1]
    assert last.startswith("verispec: error:") and message in last and "Traceback" not in err


def test_missing_prompt_file_exits_2(llama_checkpoint, capsys) -> None:
    assert main(["verify", "--model", str(llama_checkpoint), "--method", "ngram",
                 "--prompts", "/no/such/file.jsonl"]) == 2  # fmt: skip
    assert "cannot read" in capsys.readouterr().err


def test_help_states_the_verdict_rules(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["verify", "--help"])
    out = capsys.readouterr().out
    for phrase in ("near tie", "Bonferroni", "--tie-tolerance", "two-sample", "Exit status"):
        assert phrase in out
