"""The `verispec` command: human and JSON output, and exit status 2 with one line on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from verispec.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The real entry point in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "verispec.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_json_output_from_a_real_process(llama_checkpoint: Path) -> None:
    proc = run_cli("generate", "def add(a, b):", "--model", str(llama_checkpoint),
                   "--max-tokens", "5", "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert set(result) == {"text", "token_ids", "finish_reason", "metrics", "settings"}
    assert 1 <= len(result["token_ids"]) <= 5
    assert result["finish_reason"] in ("stop", "length")
    assert {"ttft_s", "itl_s", "tokens_per_s"} <= set(result["metrics"])
    assert result["settings"]["temperature"] == 0.0
    assert result["settings"]["model"] == str(llama_checkpoint)
    assert "loading" in proc.stderr  # the load progress goes to stderr, stdout stays JSON


def test_human_output_shows_text_and_summary(llama_checkpoint: Path, capsys) -> None:
    assert (
        main(["generate", "for i in", "--model", str(llama_checkpoint), "--max-tokens", "4"]) == 0
    )
    out, err = capsys.readouterr()
    assert out.startswith("for i in")
    assert "tokens/s" in err and "TTFT" in err


def test_json_matches_the_python_api(llama_checkpoint: Path, capsys) -> None:
    from verispec import LLM, SamplingParams

    args = ["generate", "class Point:", "--model", str(llama_checkpoint), "--max-tokens", "6",
            "--temperature", "0.9", "--top-p", "0.8", "--top-k", "50", "--seed", "3",
            "--json"]  # fmt: skip
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    params = SamplingParams(max_tokens=6, temperature=0.9, top_p=0.8, top_k=50, seed=3)
    expected = LLM(model=str(llama_checkpoint)).generate("class Point:", params)[0]
    assert result["token_ids"] == expected.token_ids
    assert result["text"] == expected.text


def unsupported_checkpoint(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    return tmp_path


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--temperature", "-1"], "temperature must be >= 0"),
        (["--top-p", "0"], "top_p must be in (0, 1]"),
        (["--top-p", "1.5"], "top_p must be in (0, 1]"),
        (["--top-k", "-2"], "top_k"),
        (["--max-tokens", "0"], "max_tokens"),
        (["--model", "/no/such/dir"], "does not exist"),
        (["--dtype", "float64"], "dtype must be one of"),
        (["--max-model-len", "4"], "max_model_len is 4"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    llama_checkpoint: Path, capsys, extra: list[str], message: str
) -> None:
    args = ["generate", "def add(a, b): return a + b", "--model", str(llama_checkpoint), *extra]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_unsupported_architecture_names_it_and_lists_supported(tmp_path: Path, capsys) -> None:
    assert main(["generate", "x", "--model", str(unsupported_checkpoint(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert "GPT2LMHeadModel" in err and "LlamaForCausalLM" in err and "Qwen3ForCausalLM" in err


def test_bad_input_in_a_real_process_has_no_traceback(tmp_path: Path) -> None:
    proc = run_cli("generate", "x", "--model", str(unsupported_checkpoint(tmp_path)))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("verispec: error: unsupported")
    assert "Traceback" not in proc.stderr


def test_malformed_option_is_an_argparse_error(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "x", "--max-tokens", "many"])
    assert exit_info.value.code == 2
    assert "invalid int value" in capsys.readouterr().err
