"""llama.cpp in the bench: skipped cleanly when missing, never counted as a mismatch, and (when
llama-cpp-python is installed) a real run on a tiny GGUF model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers.checkpoints import make_checkpoint
from tests.helpers.gguf_files import write_gguf_file
from verispec.bench import harness, plan, summary
from verispec.bench.engines import BatchRun, MethodSpec, RequestRun, Sampling, VerispecEngine
from verispec.bench.llamacpp_engine import LlamaCppEngine, llama_cpp_missing, lookup_stats
from verispec.cli.main import main
from verispec.drafters.registry import PLAIN


def test_lookup_stats_worked_example() -> None:
    stats = lookup_stats([(1, 3), (4, 2), (5, 0)], 6)
    assert (stats.num_verify_steps, stats.num_draft_tokens, stats.num_accepted_tokens) == (2, 5, 2)
    assert stats.accepted_per_position == [1, 1, 0]
    cut = lookup_stats([(1, 4)], 3)  # max_tokens stopped the step after 2 of its tokens
    assert (cut.num_draft_tokens, cut.num_accepted_tokens) == (4, 1)


def test_engine_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="runs a GGUF file"):
        LlamaCppEngine(tmp_path, None, MethodSpec(), "float32")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="plain decoding or ngram"):
        LlamaCppEngine(gguf, None, MethodSpec("draft_model", 2), "float32")


class FakeVerispec:
    """Stands in for verispec: the same ids for a prompt whatever the method."""

    engine = "verispec"
    reference = "verispec"
    note = ""
    drafts_with_models = True

    def __init__(self, target: Path, draft: Path | None, spec: MethodSpec, dtype: str) -> None:
        self.method, self.k, self.offset = spec.method, spec.k, 0

    def run(self, prompts: list[list[int]], sampling: Sampling, concurrency: int) -> BatchRun:
        ids = [[p[0] + self.offset + i for i in range(sampling.max_tokens)] for p in prompts]
        requests = [RequestRun(t, 0.01, [0.01] * (len(t) - 1)) for t in ids]
        return BatchRun(requests, 0.1 * len(prompts))


class FakeLlamaCpp(LlamaCppEngine):
    """Stands in for llama.cpp: other ids than verispec's (as its quantized weights give)."""

    def __init__(self, target: Path, draft: Path | None, spec: MethodSpec, dtype: str) -> None:
        self.method, self.k, self.offset = spec.method, spec.k, 7

    run = FakeVerispec.run


def fake_config(**kwargs: object) -> plan.BenchConfig:
    options = dict(workloads=("chat",), methods=(PLAIN, "ngram", "draft_model"), ks=(2,),
                   temperatures=(0.0,), prompts=2, max_tokens=4, repeats=1,
                   engines=("verispec", "llamacpp"))  # fmt: skip
    return plan.BenchConfig(Path("t.gguf"), Path("d"), **{**options, **kwargs})


def test_llamacpp_rows_are_never_mismatches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(plan.ENGINES, "verispec", FakeVerispec)
    monkeypatch.setitem(plan.ENGINES, "llamacpp", FakeLlamaCpp)
    monkeypatch.setitem(plan.OPTIONAL, "llamacpp", lambda: None)
    messages: list[str] = []
    rows = harness.run_bench(fake_config(), lambda p: [len(p.id)], messages.append)
    by_engine = {(r["engine"], r["method"]): r for r in rows}
    assert set(by_engine) == {
        ("verispec", PLAIN), ("verispec", "ngram"), ("verispec", "draft_model"),
        ("llamacpp", PLAIN), ("llamacpp", "ngram"),
    }  # fmt: skip
    assert all(r["greedy_mismatches"] == 0 for r in rows if r["engine"] == "verispec")
    assert all(r["greedy_mismatches"] is None for r in rows if r["engine"] == "llamacpp")
    assert any("llamacpp runs no draft-model method" in m for m in messages)
    notes = summary.comparison_notes(rows)
    assert len(notes) == 1 and "llamacpp" in notes[0] and "quantized" in notes[0]


def test_missing_llama_cpp_is_skipped_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp now fails
    monkeypatch.setitem(plan.ENGINES, "verispec", FakeVerispec)
    assert "pip install 'verispec[llamacpp]'" in (llama_cpp_missing() or "")
    messages: list[str] = []
    rows = harness.run_bench(fake_config(), lambda p: [len(p.id)], messages.append)
    assert rows and {r["engine"] for r in rows} == {"verispec"}
    assert any(m.startswith("note: skipping engine llamacpp") for m in messages)
    assert summary.comparison_notes(rows) == []


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> Path:
    """A tiny random Llama written as a float32 GGUF file (with its tokenizer), as llama.cpp's
    converter would write it."""
    hf = tmp_path_factory.mktemp("hf")
    model = make_checkpoint(hf, "llama", tokenizer, layer_scale=8.0, max_position_embeddings=2048)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf_file(path, model, tokenizer, "F32")
    return path


def test_real_llama_cpp_run_on_a_tiny_gguf(tiny_gguf: Path, one_thread: None) -> None:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    sampling = Sampling(temperature=0.0, top_p=1.0, max_tokens=24)
    prompts = [[0, *range(10, 30), *range(10, 20)], [0, 5, 6, 7, 8, 5, 6, 7]]
    plain = LlamaCppEngine(tiny_gguf, None, MethodSpec(), "float32").run(prompts, sampling, 1)
    # float32 weights: llama.cpp fed the same ids greedily decodes what verispec does
    verispec = VerispecEngine(tiny_gguf, None, MethodSpec(), "float32").run(prompts, sampling, 1)
    assert [r.token_ids for r in plain.requests] == [r.token_ids for r in verispec.requests]
    lookup = LlamaCppEngine(tiny_gguf, None, MethodSpec("ngram", 3), "float32")
    run = lookup.run(prompts, sampling, 1)
    for result in (plain, run):
        for r in result.requests:
            assert 1 <= len(r.token_ids) <= 24 and r.ttft_s > 0
            assert len(r.itl_s) == len(r.token_ids) - 1
    assert plain.spec_stats().num_draft_tokens == 0
    stats = run.spec_stats()  # the prompts repeat themselves: prompt lookup drafts from them
    assert stats.num_verify_steps > 0
    assert 0 <= stats.num_accepted_tokens <= stats.num_draft_tokens <= 3 * stats.num_verify_steps
    with pytest.raises(ValueError, match="one prompt at a time"):
        lookup.run(prompts, sampling, 2)


def test_bench_chat_on_a_gguf_file(tiny_gguf: Path, tmp_path: Path, capsys) -> None:
    """`verispec bench` on a GGUF file: its chat template renders the chat workload; llama.cpp
    rows (when it is installed) are reported and never counted as mismatches."""
    out = tmp_path / "bench.json"
    args = ["bench", "--target", str(tiny_gguf), "--workloads", "chat", "--methods", "none,ngram",
            "--engines", "verispec,transformers,llamacpp", "--k", "2", "--temperatures", "0",
            "--prompts", "2", "--max-tokens", "6", "--repeats", "1", "--threads", "1",
            "--no-verify-cost", "--json", str(out)]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr()
    result = json.loads(out.read_text())
    engines = ["verispec", "transformers"] + ([] if llama_cpp_missing() else ["llamacpp"])
    assert {(r["engine"], r["method"]) for r in result["rows"]} == {
        (e, m) for e in engines for m in (PLAIN, "ngram")
    }
    for r in result["rows"]:
        assert r["workload"] == "chat" and r["tokens_per_s"] > 0 and r["max_tokens"] == 6
        assert r["greedy_mismatches"] == (None if r["engine"] == "llamacpp" else 0), r
    if "llamacpp" in engines:
        assert "note: llamacpp greedy ids are not compared" in printed.out
        assert result["notes"] and result["settings"]["llama_cpp_python"]
    else:
        assert "note: skipping engine llamacpp" in printed.err
