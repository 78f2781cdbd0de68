"""llama.cpp's command-line tools as the pair benchmark runs them: command lines, and the
figures parsed from their output (samples in the format their sources print)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.lib.llamacpp_tools import (
    NO_DRAFT_NGRAM,
    SpeculativeRun,
    llama_bench_command,
    no_draft_flags,
    parse_llama_bench,
    parse_speculative_simple,
    run_speculative_simple,
    speculative_command,
)
from tests.helpers.checkpoints import make_checkpoint
from tests.helpers.gguf_files import write_gguf_file
from verispec.bench.engines import Sampling

DRAFTED_LOG = """\
Read 68 bytes from binary file /tmp/prompt.txt
0.00.047.835 I common_speculative_init_result: loading draft model '/models/draft.gguf'
0.00.069.621 I encoded   49 tokens in    0.003 seconds, speed: 17625.898 t/s
0.00.069.646 I decoded  129 tokens in   10.750 seconds, speed:   12.000 t/s
0.00.069.662 I
0.00.069.678 I n_draft   = 3
0.00.069.693 I n_predict = 129
0.00.069.708 I n_drafted = 111
0.00.069.724 I n_accept  = 99
0.00.069.739 I accept    = 89.189%
0.00.069.754 I
0.00.069.768 I draft:
"""
PLAIN_LOG = """\
encoded   49 tokens in    0.002 seconds, speed: 28372.900 t/s
decoded   25 tokens in    0.014 seconds, speed: 1742.889 t/s

n_draft   = 3
n_predict = 25
n_drafted = 0
n_accept  = 0
accept    = -nan%
"""
LLAMA_BENCH_JSON = """[
  {"build_commit": "abc", "n_prompt": 0, "n_gen": 128, "avg_ts": 33.04, "stddev_ts": 0.4}
]"""


def test_parse_speculative_simple() -> None:
    run = parse_speculative_simple(DRAFTED_LOG)
    assert run == SpeculativeRun(129, 10.75, 12.0, 111, 99)
    assert run.acceptance == pytest.approx(99 / 111)
    plain = parse_speculative_simple(PLAIN_LOG)  # no timestamps, and nan% acceptance
    assert plain == SpeculativeRun(25, 0.014, 1742.889, 0, 0) and plain.acceptance is None
    with pytest.raises(ValueError, match="n_drafted"):
        parse_speculative_simple(DRAFTED_LOG.replace("n_drafted", "drafted"))
    with pytest.raises(ValueError, match="decoded N tokens"):
        parse_speculative_simple("error: failed to load model\n")


def test_parse_llama_bench() -> None:
    prompt_row = '{"n_prompt": 512, "n_gen": 0, "avg_ts": 900.0}, '
    assert parse_llama_bench(LLAMA_BENCH_JSON.replace("[\n", "[" + prompt_row)) == 33.04
    for bad in ("", "[]", '[{"n_gen": 0, "avg_ts": 1.0}]', "not json"):
        with pytest.raises(ValueError, match="no tg result"):
            parse_llama_bench(bad)
    assert llama_bench_command("lb", "m.gguf", 2, 64) == [
        "lb", "-m", "m.gguf", "-t", "2", "-p", "0", "-n", "64", "-o", "json"]  # fmt: skip


def test_no_draft_flags_keep_the_lookup_out_of_reach() -> None:
    """ngram-simple looks up only past size-n + size-m + 1 tokens of context."""
    def reach(flags: list[str]) -> int:
        sizes = [int(flags[flags.index(f"--spec-ngram-simple-size-{x}") + 1]) for x in "nm"]
        return sum(sizes) + 1

    for tokens in (10, NO_DRAFT_NGRAM, 1500, 2 * NO_DRAFT_NGRAM):
        flags = no_draft_flags(tokens)
        assert flags[:2] == ["--spec-type", "ngram-simple"] and reach(flags) > tokens
    assert no_draft_flags(1500)[-1] == "476"
    with pytest.raises(ValueError, match="at most 2048 tokens"):
        no_draft_flags(2 * NO_DRAFT_NGRAM + 1)


def test_speculative_command() -> None:
    greedy = Sampling(temperature=0.0, top_p=1.0, max_tokens=256)
    with_draft = speculative_command("lss", "t.gguf", "p.txt", greedy, 2, seed=0, draft="d.gguf",
                                     k=4, context_tokens=400)  # fmt: skip
    assert with_draft[:5] == ["lss", "-m", "t.gguf", "-bf", "p.txt"]
    assert "--no-escape" in with_draft
    joined = " ".join(with_draft)
    assert "-n 256 -t 2 --temp 0 --top-p 1 --top-k 0 --min-p 0 --seed 0" in joined
    assert joined.endswith("-md d.gguf --spec-type draft-simple --spec-draft-n-max 4 -td 2")
    sampled = Sampling(temperature=0.7, top_p=0.95, max_tokens=64)
    plain = speculative_command("lss", "t.gguf", "p.txt", sampled, 2, seed=7, draft=None, k=4,
                                context_tokens=400)  # fmt: skip
    assert "--temp 0.7 --top-p 0.95 --top-k 0 --min-p 0 --seed 7" in " ".join(plain)
    assert "-md" not in plain and plain[-len(no_draft_flags(400)):] == no_draft_flags(400)


def fake_tool(tmp_path: Path, logs: list[str], status: int = 0) -> list[str]:
    """A command that prints logs[i] to stderr on its i-th run (the last one ever after) and
    exits with status: a stand-in for llama-speculative-simple."""
    for i, log in enumerate(logs):
        (tmp_path / f"log{i}").write_text(log)
    script = tmp_path / "tool.sh"
    script.write_text(
        f'cd "{tmp_path}"; n=$(cat runs 2>/dev/null || echo 0); echo $((n + 1)) > runs\n'
        f'cat "log$(( n < {len(logs) - 1} ? n : {len(logs) - 1} ))" >&2; exit {status}\n'
    )
    return ["bash", str(script)]


def test_run_speculative_simple_runs_again_when_the_log_lost_its_figures(tmp_path: Path) -> None:
    """llama.cpp's logger is not flushed at exit: a run may come back without its figures."""
    lost = "Read 48 bytes from binary file /tmp/prompt.txt\n"
    command = fake_tool(tmp_path, [lost, lost, DRAFTED_LOG])
    assert run_speculative_simple(command) == parse_speculative_simple(DRAFTED_LOG)
    assert (tmp_path / "runs").read_text().strip() == "3"
    (tmp_path / "runs").unlink()
    with pytest.raises(ValueError, match="decoded N tokens"):
        run_speculative_simple(command, attempts=2)
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        run_speculative_simple(command, attempts=0)


def test_run_speculative_simple_does_not_retry_a_failed_run(tmp_path: Path) -> None:
    command = fake_tool(tmp_path, ["error: failed to load model\n", DRAFTED_LOG], status=1)
    with pytest.raises(ValueError, match="exited with 1: error: failed to load model"):
        run_speculative_simple(command)
    assert (tmp_path / "runs").read_text().strip() == "1"


LLAMA_CPP_BIN = os.environ.get("VERISPEC_LLAMA_CPP_BIN")


@pytest.mark.skipif(not LLAMA_CPP_BIN, reason="set VERISPEC_LLAMA_CPP_BIN to llama.cpp's bin/")
def test_llama_speculative_simple_on_a_tiny_gguf(tmp_path: Path, tokenizer) -> None:
    """The real tool takes both command lines: without a draft it drafts nothing and takes
    one target step a token; with the model as its own draft it accepts drafts."""
    model = make_checkpoint(tmp_path / "hf", "llama", tokenizer, layer_scale=8.0,
                            max_position_embeddings=4096)  # fmt: skip
    gguf = tmp_path / "tiny.gguf"
    write_gguf_file(gguf, model, tokenizer, "F32")
    prompt = tmp_path / "prompt.txt"
    prompt.write_bytes(b"def add(a, b):\n    return a + b\n\ndef add(a, b):\n")
    binary = str(Path(str(LLAMA_CPP_BIN)) / "llama-speculative-simple")
    greedy = Sampling(temperature=0.0, top_p=1.0, max_tokens=24)
    plain, drafted = (
        run_speculative_simple(speculative_command(binary, str(gguf), str(prompt), greedy, 1,
                                                   seed=0, draft=draft, k=3, context_tokens=100),
                               attempts=8)  # tiny runs exit before the log thread gets a turn
        for draft in (None, str(gguf))
    )  # fmt: skip
    assert plain.drafted == 0 and plain.decoded > 0 and plain.tokens_per_s > 0, plain
    assert drafted.drafted > 0 and drafted.accepted > 0, drafted
