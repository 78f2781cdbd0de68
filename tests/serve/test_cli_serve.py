"""`verispec serve` as a user runs it: a real process on a free port, answering the openai
client; bad options exit 2 with one line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from verispec.cli.main import main


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_process_answers_the_openai_client(chat_pair: tuple[Path, Path]) -> None:
    target, draft = chat_pair
    port = free_port()
    spec = json.dumps({"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "verispec.cli", "serve", "--model", str(target), "--port",
         str(port), "--speculative-config", spec, "--api-key", "k", "--max-num-seqs", "2",
         "--max-model-len", "128", "--max-request-bytes", "100000",
         "--max-sequences-per-request", "4", "--trust-request-chat-template",
         "--template-timeout", "5", "--body-timeout", "10", "--max-prompt-bytes", "1000"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    assert json.loads(r.read()) == {"status": "ok"}
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(process.communicate()[0]) from None
                time.sleep(0.2)
        client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
        (model,) = client.models.list().data
        assert model.id == str(target) and model.model_extra["max_model_len"] == 128
        out = client.completions.create(model=model.id, prompt="def f():", max_tokens=8,
                                        temperature=0)  # fmt: skip
        assert out.usage.completion_tokens == 8
        assert out.model_extra["speculation"]["num_draft_tokens"] > 0
        with pytest.raises(openai.BadRequestError, match="at most 4 per request"):
            client.completions.create(model=model.id, prompt="x", max_tokens=1, n=5)
        with pytest.raises(openai.APIStatusError, match="at most 100000") as too_large:
            client.completions.create(model=model.id, prompt="x" * 100_000, max_tokens=1)
        assert too_large.value.status_code == 413
        own = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        chat = client.chat.completions.create(
            model=model.id, messages=[{"role": "user", "content": "def f():"}], max_tokens=2,
            extra_body={"chat_template_kwargs": {"chat_template": own}, "return_token_ids": True},
        )  # fmt: skip
        assert chat.choices[0].model_extra["prompt_token_ids"] == client_tokens(target, "def f():")
        with pytest.raises(openai.APIStatusError, match="at most 1000 bytes") as long_prompt:
            client.chat.completions.create(model=model.id, max_tokens=1,
                                           messages=[{"role": "user", "content": "y" * 1000}])
        assert long_prompt.value.status_code == 413
    finally:
        process.terminate()
        output = process.communicate(timeout=30)[0]
    assert process.returncode in (0, -15), output
    assert "serving" in output


def client_tokens(target: Path, text: str) -> list[int]:
    """The ids of a text as the served tokenizer writes them, without special tokens."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(target)).encode(text, add_special_tokens=False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--speculative-config", "{bad"], "not valid JSON"),
        (["--speculative-config", "[1]"], "must be a JSON object"),
        (["--speculative-config", '{"method": "ngram"}', "--k", "3"], "replaces --k"),
        (["--speculative-config", '{"nope": 1}'], "unknown key"),
        (["--max-num-seqs", "0"], "--max-num-seqs must be >= 1"),
        (["--long-prefill-chunk", "0"], "--long-prefill-chunk must be >= 1"),
        (["--served-model-name", " "], "--served-model-name must not be empty"),
        (["--max-request-bytes", "0"], "--max-request-bytes must be >= 1"),
        (["--max-sequences-per-request", "-2"], "--max-sequences-per-request must be >= 1"),
        (["--max-prompt-bytes", "0"], "--max-prompt-bytes must be >= 1"),
        (["--body-timeout", "0"], "--body-timeout must be a number of seconds > 0"),
        (["--body-timeout", "inf"], "--body-timeout must be a number of seconds > 0"),
        (["--template-timeout", "-1"], "--template-timeout must be a number of seconds > 0"),
        (["--allowed-origins", "localhost:3000/"], "allowed origin 'localhost:3000/' is not"),
    ],
)
def test_bad_serve_options_exit_2_with_one_line(
    llama_checkpoint: Path, args: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    assert main(["serve", "--model", str(llama_checkpoint), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and err[-1].startswith("verispec: error:")
