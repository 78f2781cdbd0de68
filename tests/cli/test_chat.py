"""`verispec chat`: one streamed answer with a stats line, and multi-turn sessions driven through
stdin (in process, through a pipe, and through a pseudo-terminal)."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.chat import with_chat_template
from tests.helpers.checkpoints import make_checkpoint, make_perturbed_copy
from verispec import LLM, SamplingParams, SpecConfig
from verispec.cli.chat import ChatSession
from verispec.cli.main import main

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: a second thread only waits

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)
STATS = re.compile(r"\[session: 2 answers, \d+ tokens, [\d.]+ tokens/s\]")


@pytest.fixture(scope="module")
def chat_pair(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> tuple[Path, Path]:
    """(target, draft) with a chat template: a sharp tiny Llama and a perturbed copy."""
    chat_tokenizer = with_chat_template(tokenizer)
    target, draft = tmp_path_factory.mktemp("chat-target"), tmp_path_factory.mktemp("chat-draft")
    model = make_checkpoint(target, "llama", chat_tokenizer, layer_scale=8.0)
    make_perturbed_copy(draft, model, chat_tokenizer, noise=0.03)
    return target, draft


@pytest.fixture(scope="module")
def llm(chat_pair: tuple[Path, Path]) -> LLM:
    return LLM(model=str(chat_pair[0]))


def answers(llm: LLM, *turns: str) -> list[str]:
    """The greedy answers to `turns` asked one after another in one conversation."""
    history: list[dict[str, str]] = []
    texts = []
    for turn in turns:
        history.append({"role": "user", "content": turn})
        texts.append(llm.chat(history, GREEDY)[0].text)
        history.append({"role": "assistant", "content": texts[-1]})
    return texts


ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}
"""The environment of the real processes: a tiny model gains nothing from a second thread."""


def run_cli(args: list[str], **options) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "verispec.cli", *args], timeout=120,
                          env=ONE_THREAD, **options)  # fmt: skip


def test_one_answer_is_streamed_then_a_stats_line(chat_pair: tuple[Path, Path], capsys) -> None:
    target, draft = chat_pair
    args = ["chat", "def add(a, b):", "--model", str(target), "--draft", str(draft),
            "--max-tokens", "12"]  # fmt: skip
    assert main(args) == 0
    out, err = capsys.readouterr()
    spec = SpecConfig(model=str(draft))
    params = SamplingParams(temperature=0.0, max_tokens=12)
    expected = LLM(model=str(target), speculative=spec).chat(
        [{"role": "user", "content": "def add(a, b):"}], params
    )[0]
    assert out == expected.text + "\n"
    stats = err.strip().splitlines()[-1]
    pattern = (r"\[\d+ tokens, [\d.]+ tokens/s, TTFT \d+ ms, accepted \d+% of \d+ drafts, "
               r"[\d.]+ tokens/step\]")
    assert re.fullmatch(pattern, stats)


@pytest.mark.parametrize("prompt", [["hello"], []])
def test_model_without_a_chat_template_exits_2(
    llama_checkpoint: Path, capsys, prompt: list[str]
) -> None:
    assert main(["chat", *prompt, "--model", str(llama_checkpoint)]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err == (
        f"verispec: error: model {llama_checkpoint} has no chat template; "
        "use generate() with a plain prompt"
    )


def test_session_keeps_history_and_obeys_commands(llm: LLM) -> None:
    out, err = io.StringIO(), io.StringIO()
    session = ChatSession(llm, GREEDY, False, out, err)
    lines = ["hi\n", "\n", "  ", "how are you\n", "/stats", "/reset", "/bogus", "hi", "/exit"]
    assert [session.handle(line) for line in lines] == [True] * 8 + [False]
    first, second = answers(llm, "hi", "how are you")
    assert out.getvalue() == f"{first}\n{second}\n{first}\n"  # /reset: "hi" answered afresh
    assert session.history == [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": first}
    ]  # fmt: skip
    notes = err.getvalue().splitlines()
    assert len(notes) == 6
    assert notes[0] == notes[1] == notes[5] == "[answer cut at 6 tokens: --max-tokens]"
    assert STATS.fullmatch(notes[2]) and notes[3] == "[history cleared]"
    assert notes[4].startswith("verispec: error: unknown command /bogus; /reset clears")
    assert session.stats.answers == 3 and session.stats.tokens == 18


def test_speculative_session_stats_sum_the_answers(chat_pair: tuple[Path, Path]) -> None:
    target, draft = chat_pair
    llm = LLM(model=str(target), speculative={"model": str(draft)})
    out, err = io.StringIO(), io.StringIO()
    session = ChatSession(llm, SamplingParams(temperature=0.0, max_tokens=12), True, out, err)
    first, second = session.ask("hi"), session.ask("how are you")
    session.handle("/stats")
    stats = session.stats.spec
    for field in ("num_verify_steps", "num_draft_tokens", "num_accepted_tokens"):
        per_answer = (getattr(o.metrics.spec, field) for o in (first, second))
        assert getattr(stats, field) == sum(per_answer) > 0
    line = err.getvalue().splitlines()[-1]
    assert line == (
        f"[session: 2 answers, {len(first.token_ids) + len(second.token_ids)} tokens, "
        f"{session.stats.tokens / session.stats.seconds:.1f} tokens/s, accepted "
        f"{stats.acceptance_rate:.0%} of {stats.num_draft_tokens} drafts, "
        f"{stats.mean_acceptance_length:.1f} tokens/step]"
    )


def test_a_line_too_long_for_the_context_is_an_error_and_the_session_goes_on(
    chat_pair: tuple[Path, Path],
) -> None:
    llm = LLM(model=str(chat_pair[0]), max_model_len=32)
    out, err = io.StringIO(), io.StringIO()
    session = ChatSession(llm, GREEDY, False, out, err)
    assert session.handle("word " * 40) and session.handle("hi")
    assert "max_model_len is 32" in err.getvalue().splitlines()[0]
    assert out.getvalue() == answers(llm, "hi")[0] + "\n"


def test_session_through_a_pipe(chat_pair: tuple[Path, Path], llm: LLM) -> None:
    stdin = b"hi\n\n\xff\n/stats\nhow are you\n/reset\n/stats\n"
    args = ["chat", "--model", str(chat_pair[0]), "--max-tokens", "6"]
    proc = run_cli(args, input=stdin, capture_output=True)
    assert proc.returncode == 0, proc.stderr
    first, second = answers(llm, "hi", "how are you")
    assert proc.stdout.decode() == f"{first}\n{second}\n"
    err = proc.stderr.decode()
    assert "verispec: error: the line is not valid UTF-8 text: byte 0xff at index 0" in err
    assert "[session: 1 answer, 6 tokens" in err and STATS.search(err)
    assert "[history cleared]" in err and "Traceback" not in err


def test_session_on_a_terminal(chat_pair: tuple[Path, Path], llm: LLM) -> None:
    """stdin and stdout on a pseudo-terminal: input() prompts "> " (on stderr, as Python does
    without GNU readline) before each line; Ctrl-D ends the session."""
    master, slave = pty.openpty()
    args = ["chat", "--model", str(chat_pair[0]), "--max-tokens", "6"]
    with subprocess.Popen(
        [sys.executable, "-m", "verispec.cli", *args],
        stdin=slave, stdout=slave, stderr=subprocess.PIPE, env=ONE_THREAD,
    ) as proc:  # fmt: skip
        os.close(slave)
        os.write(master, b"hi\n/stats\nhow are you\n/stats\n\x04")
        screen = read_until_closed(master)
        err = proc.stderr.read().decode()
    os.close(master)
    assert proc.returncode == 0, err
    first, second = answers(llm, "hi", "how are you")
    assert err.count("> ") == 5
    assert screen.endswith(f"/stats\n{first}\n{second}\n\n")  # after the echoed input
    assert "[session: 1 answer" in err and STATS.search(err)


def read_until_closed(fd: int, timeout: float = 120) -> str:
    """All a pseudo-terminal shows until its last writer exits ("\\r\\n" read as "\\n")."""
    chunks = []
    while select.select([fd], [], [], timeout)[0]:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # Linux: EIO once the child's side is closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
