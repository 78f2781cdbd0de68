"""The `verispec` command: human and JSON output, and exit status 2 with one line on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.checkpoints import SPEC_PAIRS
from verispec.cli import chat as cli_chat
from verispec.cli import generate as cli_generate
from verispec.cli import main as cli
from verispec.cli import options as cli_options
from verispec.cli import serve as cli_serve
from verispec.cli import train as cli_train
from verispec.cli.main import build_parser, main
from verispec.cli.options import spec_config
from verispec.config import SpecConfig
from verispec.drafters.registry import (
    DEFAULT_METHOD,
    HEAD_METHOD,
    MODEL_FREE_METHOD,
    PLAIN,
    method_names,
    takes_model,
)
from verispec.models.catalog.default import HEADS_DIR, embedded_model_path
from verispec.models.weights.loader import resolve_head_path
from verispec.spec.resolve import DraftRuntime, default_drafter, own_drafter, resolve_speculative
from verispec.train.tokenizer import save_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: a second thread only waits


def run_cli(*args: str | bytes, one_thread: bool = True) -> subprocess.CompletedProcess[str]:
    """The real entry point in a fresh interpreter (with one torch thread unless told otherwise:
    the tiny models gain nothing from a second one, which only waits)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"} if one_thread else None
    return subprocess.run([sys.executable, "-m", "verispec.cli", *args], capture_output=True,
                          text=True, timeout=120, env=env)  # fmt: skip


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


def unsupported_checkpoint(tmp_path: Path, tokenizer) -> Path:
    """A checkpoint directory complete but for its architecture, which verispec does not run."""
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    save_tokenizer(tokenizer, tmp_path)
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


def test_unsupported_architecture_names_it_and_lists_supported(
    tmp_path: Path, tokenizer, capsys
) -> None:
    assert main(["generate", "x", "--model", str(unsupported_checkpoint(tmp_path, tokenizer))]) == 2
    err = capsys.readouterr().err
    assert "GPT2LMHeadModel" in err and "LlamaForCausalLM" in err and "Qwen3ForCausalLM" in err


def test_bad_input_in_a_real_process_has_no_traceback(tmp_path: Path, tokenizer) -> None:
    proc = run_cli("generate", "x", "--model", str(unsupported_checkpoint(tmp_path, tokenizer)))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("verispec: error: unsupported")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("flag", ["--model", "--draft"])
def test_empty_model_or_draft_name_exits_2(capsys, flag: str) -> None:
    assert main(["generate", "x", flag, ""]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"verispec: error: {flag} must not be empty; give a checkpoint "
                                "directory or model name"]  # fmt: skip


def test_bad_arguments_exit_2_in_a_real_process() -> None:
    """Before any model loads. The shell passes bytes; Python decodes argv with surrogateescape,
    so 0xff arrives as U+DCFF, and the message names the byte."""
    proc = run_cli("generate", b"ab\xff\xfe")
    assert proc.returncode == 2
    message = "PROMPT is not valid UTF-8 text: byte 0xff at index 2; pass UTF-8 text"
    assert proc.stderr.splitlines() == [f"verispec: error: {message}"]


def test_an_empty_model_name_ends_a_chat_before_it_loads(capsys) -> None:
    """The chat command checks its names first too (in-process: the real process's exit path
    is the test above)."""
    assert main(["chat", "--model", "", "--method", MODEL_FREE_METHOD, "--k", "2"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "verispec: error: --model must not be empty; give a checkpoint directory or model name"
    ]


def test_malformed_option_is_an_argparse_error(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "x", "--max-tokens", "many"])
    assert exit_info.value.code == 2
    assert "invalid int value" in capsys.readouterr().err


# Speculative decoding options: one target/draft pair (llama) of spec_pair's three keeps these
# fast. Method names come from the registry, as in the cli modules.
ONE_PAIR = pytest.mark.parametrize("spec_pair", [SPEC_PAIRS[0]], indirect=True, ids=["llama"])
ACCEPTANCE_FIELDS = {
    "num_verify_steps", "num_draft_tokens", "num_accepted_tokens", "acceptance_rate",
    "mean_acceptance_length", "per_position_acceptance_rate",
}  # fmt: skip


def generate_json(capsys, *args: str) -> dict:
    assert main(["generate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_method_choices_come_from_the_registry() -> None:
    # the commands whose options take a method (bench's --serving check names its head flags)
    modules = (cli, cli_options, cli_generate, cli_chat, cli_serve, cli_train)
    source = "".join(Path(m.__file__).read_text() for m in modules)
    for name in method_names():
        assert f'"{name}"' not in source and f"'{name}'" not in source
        assert build_parser().parse_args(["generate", "x", "--method", name]).method == name


def test_plain_json_has_no_method(llama_checkpoint: Path, capsys) -> None:
    result = generate_json(capsys, "def f():", "--model", str(llama_checkpoint),
                           "--max-tokens", "3")  # fmt: skip
    settings = result["settings"]
    assert (settings["method"], settings["k"], settings["draft"]) == (None, None, None)
    assert ACCEPTANCE_FIELDS <= set(result["metrics"])
    assert result["metrics"]["num_draft_tokens"] == 0


@ONE_PAIR
def test_draft_implies_draft_model_and_reports_acceptance(spec_pair, capsys) -> None:
    target, draft = spec_pair
    result = generate_json(capsys, "def add(a, b):", "--model", str(target), "--draft",
                           str(draft), "--k", "3", "--max-tokens", "12")  # fmt: skip
    settings, metrics = result["settings"], result["metrics"]
    assert takes_model(settings["method"])
    assert (settings["k"], settings["draft"]) == (3, str(draft))
    assert metrics["num_verify_steps"] > 0
    assert metrics["num_draft_tokens"] <= 3 * metrics["num_verify_steps"]
    assert 0 <= metrics["acceptance_rate"] <= 1
    assert metrics["mean_acceptance_length"] == pytest.approx(
        1 + metrics["num_accepted_tokens"] / metrics["num_verify_steps"]
    )
    assert len(metrics["per_position_acceptance_rate"]) <= 3


@ONE_PAIR
def test_batch_invariant_speculation_equals_plain_greedy(spec_pair, capsys) -> None:
    target, draft = spec_pair
    common = ["class Point:", "--model", str(target), "--max-tokens", "16", "--batch-invariant"]
    plain = generate_json(capsys, *common)
    spec = generate_json(capsys, *common, "--draft", str(draft), "--k", "4")
    assert spec["settings"]["batch_invariant"] is True
    assert spec["token_ids"] == plain["token_ids"]


@ONE_PAIR
def test_human_output_has_an_acceptance_line(spec_pair, capsys) -> None:
    target, draft = spec_pair
    args = ["generate", "for i in", "--model", str(target), "--draft", str(draft),
            "--max-tokens", "10"]  # fmt: skip
    assert main(args) == 0
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "accepted" in x)
    assert "% of" in line and "tokens/step" in line and ", k=4)" in line


def test_ngram_options_reach_the_engine(llama_checkpoint: Path, capsys) -> None:
    ngram = next(m for m in method_names() if not takes_model(m))
    result = generate_json(capsys, "a b a b a b a b", "--model", str(llama_checkpoint),
                           "--method", ngram, "--k", "2", "--prompt-lookup-min", "1",
                           "--prompt-lookup-max", "3", "--max-tokens", "8")  # fmt: skip
    assert (result["settings"]["method"], result["settings"]["k"]) == (ngram, 2)
    assert result["settings"]["draft"] is None
    assert len(result["token_ids"]) == 8
    assert result["metrics"]["num_draft_tokens"] > 0  # the prompt and output repeat themselves


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--method", "{needs_draft}"], "--method {needs_draft} needs --draft"),
        (["--method", "{no_draft}", "--draft", "{draft}"], "takes no draft model"),
        (["--k", "3"], "--k needs --draft or --method"),
        (["--prompt-lookup-max", "3"], "--prompt-lookup-max needs --draft or --method"),
        (["--method", "{no_draft}", "--k", "0"], "--k must be an integer in [1, 16], got 0"),
        (["--method", "{no_draft}", "--k", "17"], "--k must be an integer in [1, 16], got 17"),
        (["--method", "{no_draft}", "--prompt-lookup-min", "3", "--prompt-lookup-max", "2"],
         "1 <= --prompt-lookup-min <= --prompt-lookup-max, got 3 and 2"),
        (["--method", "{no_draft}", "--draft-quantization", "fp16"],
         "does not use --draft-quantization"),
        (["--method", "{no_draft}", "--draft-vocab-size", "100"],
         "does not use --draft-vocab-size"),
        (["--method", "{needs_draft}", "--draft", "{draft}", "--draft-vocab-size", "0"],
         "--draft-vocab-size must be an integer >= 1"),
        (["--method", "{needs_draft}", "--draft", "{draft}", "--prompt-lookup-min", "2"],
         "does not use --prompt-lookup-min"),
        (["--draft", "/no/such/dir"], "does not exist"),
    ],
)  # fmt: skip
def test_bad_speculative_options_exit_2(
    llama_checkpoint: Path, capsys, extra: list[str], message: str
) -> None:
    names = {
        "needs_draft": next(m for m in method_names() if takes_model(m)),
        "no_draft": next(m for m in method_names() if not takes_model(m)),
        "draft": str(llama_checkpoint),
    }
    args = ["generate", "x", "--model", str(llama_checkpoint), *(a.format(**names) for a in extra)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message.format(**names) in err
    assert err.splitlines()[-1].startswith("verispec: error: ") and "Traceback" not in err


def test_unknown_method_is_an_argparse_error(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "x", "--method", "no-such-method"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


@ONE_PAIR
def test_json_output_from_a_real_process(spec_pair) -> None:
    """stdout is the JSON alone, the load progress (target and draft) goes to stderr. One
    process, speculative: the plain JSON's fields are checked in-process above."""
    target, draft = spec_pair
    proc = run_cli("generate", "import os", "--model", str(target), "--draft", str(draft),
                   "--k", "2", "--max-tokens", "6", "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert set(result) == {"text", "token_ids", "finish_reason", "metrics", "settings"}
    assert 1 <= len(result["token_ids"]) <= 6
    assert result["finish_reason"] in ("stop", "length")
    assert {"ttft_s", "itl_s", "tokens_per_s"} | ACCEPTANCE_FIELDS <= set(result["metrics"])
    assert result["settings"]["temperature"] == 0.0
    assert result["settings"]["model"] == str(target)
    assert result["settings"]["k"] == 2 and result["settings"]["draft"] == str(draft)
    assert "loading" in proc.stderr  # the load progress goes to stderr, stdout stays JSON


README_QUESTION = "What is the capital of France? Answer in one sentence."
"""The README's first command's question (the bare question is a near tie at its first token,
which a8's rounding flips, as llama.cpp's does: docs/usage.md)."""


def test_readme_main_job_answers_in_a_real_process(smollm2_path: Path) -> None:
    """The README's first command: the default model (SmolLM2) answers a chat question, with
    prompt lookup drafting, under its default numerics (a8), and prints tokens/s and
    acceptance."""
    proc = run_cli("chat", README_QUESTION, "--max-tokens", "24", one_thread=False)
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout
    stats = proc.stderr.strip().splitlines()[-1]
    assert "tokens/s" in stats and "drafts" in stats, stats


def test_the_cli_resolves_once_and_hands_llm_the_result(monkeypatch) -> None:
    """load_llm resolves the flags into a ResolvedSpec and LLM passes it to the engine as it
    is: the resolver's last stage runs once, and the engine gets that very object."""
    import verispec.api.llm as api_llm
    from verispec.spec import resolve as resolve_module

    finished: list[object] = []
    real_finish = resolve_module._finish
    monkeypatch.setattr(resolve_module, "_finish",
                        lambda *a: finished.append(real_finish(*a)) or finished[-1])  # fmt: skip
    engines: list[tuple[object, object]] = []
    monkeypatch.setattr(api_llm, "Engine",
                        lambda config, drafter, progress: engines.append((config, drafter)))
    args = build_parser().parse_args(["generate", "x", "--method", MODEL_FREE_METHOD, "--k", "3"])
    cli_options.load_llm(args)
    assert len(finished) == 1 and len(engines) == 1
    config, drafter = engines[0]
    assert config.speculative is finished[0] and drafter is not None  # type: ignore[attr-defined]


def test_default_model_drafts_by_prompt_lookup() -> None:
    """SmolLM2's shipped head is not its default drafter: prompt lookup was measured faster
    (hub.py); the head stays one --method away (next test)."""

    def spec(*args: str) -> object:
        return spec_config(build_parser().parse_args(["generate", "x", *args]))

    assert spec() == resolve_speculative(None, "auto")  # resolved: what runs
    assert spec().adaptive is True
    auto = default_drafter(None)
    assert auto == SpecConfig(method=MODEL_FREE_METHOD)
    k2 = spec("--k", "2")  # the same drafter, 2 tokens a step
    assert (k2.method, k2.num_speculative_tokens, k2.model) == (MODEL_FREE_METHOD, 2, None)
    lookup = spec("--method", MODEL_FREE_METHOD)
    assert (lookup.method, lookup.model) == (MODEL_FREE_METHOD, None)
    assert spec("--method", PLAIN) is None
    with pytest.raises(ValueError, match="needs --draft"):
        spec("--method", next(m for m in method_names() if takes_model(m)))


def test_head_method_without_draft_uses_the_models_shipped_head() -> None:
    """The default model ships an EAGLE head: --method alone takes it with its tuned tree;
    with --k the same head drafts a chain of k; it loads by name too."""

    def spec(*args: str) -> object:
        return spec_config(build_parser().parse_args(["generate", "x", *args]))

    own = own_drafter(None, HEAD_METHOD)
    assert own is not None and Path(own.model) == HEADS_DIR / "smollm2-135m-instruct-eagle"
    assert spec("--method", HEAD_METHOD) == resolve_speculative(None, own)
    assert spec("--method", HEAD_METHOD).tree_topk == own.tree_topk
    chain = spec("--method", HEAD_METHOD, "--k", "3")
    assert (chain.model, chain.num_speculative_tokens, chain.tree_topk) == (own.model, 3, None)
    assert resolve_head_path("smollm2-135m-instruct-eagle") == Path(own.model)
    draft = SpecConfig(method=DEFAULT_METHOD, model="embedded-code-draft", quantization="auto")
    assert own_drafter("embedded-code", DEFAULT_METHOD) == draft
    assert own_drafter("/some/dir", HEAD_METHOD) is None


def test_draft_quantization_auto_and_none() -> None:
    """--draft-quantization none keeps a draft as stored, auto asks for w8a8 where VNNI runs it;
    a named model's own draft runs auto unless told otherwise."""

    def spec(*args: str) -> SpecConfig:
        return spec_config(build_parser().parse_args(["generate", "x", *args]))

    given = ("--method", DEFAULT_METHOD, "--draft", "d", "--draft-quantization")
    assert spec(*given, "none").quantization is None
    auto = DraftRuntime().draft_quantization("auto")  # resolved: w8a8 where VNNI runs it
    assert spec(*given, "auto").quantization == auto
    assert spec("--method", DEFAULT_METHOD, "--draft", "d").quantization is None
    own = ("--model", "embedded-code", "--method", DEFAULT_METHOD, "--k", "3")
    assert spec(*own).quantization == auto
    assert spec(*own, "--draft-quantization", "none").quantization is None


def test_embedded_model_options(capsys) -> None:
    plain = generate_json(capsys, "def f(x):", "--model", "embedded-code", "--max-tokens", "4",
                          "--method", PLAIN)  # fmt: skip
    assert plain["settings"]["method"] is None and plain["metrics"]["num_draft_tokens"] == 0
    assert plain["settings"]["model"] == str(embedded_model_path("target"))
    k2 = generate_json(capsys, "def f(x):", "--model", "embedded-code", "--max-tokens", "4",
                       "--k", "2")  # fmt: skip
    assert k2["settings"]["k"] == 2 and k2["settings"]["draft"] == "embedded-code-draft"
    assert main(["generate", "x", "--method", PLAIN, "--k", "2"]) == 2
    assert f"--method {PLAIN} decodes without drafts; drop --k" in capsys.readouterr().err


@ONE_PAIR
def test_quantization_options_reach_target_and_draft(spec_pair, capsys) -> None:
    target, draft = spec_pair
    result = generate_json(capsys, "def add(a, b):", "--model", str(target), "--draft",
                           str(draft), "--quantization", "int8", "--draft-quantization", "fp16",
                           "--max-tokens", "6")  # fmt: skip
    settings = result["settings"]
    assert (settings["quantization"], settings["draft_quantization"]) == ("int8", "fp16")
    assert result["metrics"]["num_verify_steps"] > 0
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["generate", "x", "--quantization", "int4"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'int4'" in capsys.readouterr().err
