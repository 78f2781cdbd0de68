"""`verispec chat`: one streamed answer, or a multi-turn session reading lines from stdin (a
terminal or a pipe), each answer streamed as its tokens are accepted."""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TextIO

from verispec.api.llm import LLM
from verispec.cli.options import (
    acceptance_line,
    add_model_options,
    check_argument_text,
    load_llm,
    sampling_params,
)
from verispec.types.chat import require_chat_template
from verispec.types.outputs import RequestOutput
from verispec.types.sampling_params import SamplingParams
from verispec.types.stats import SpecStats

COMMANDS = "/reset clears the history, /stats shows acceptance and speed, /exit ends"


def add_chat_parser(sub: argparse._SubParsersAction) -> None:
    """The `chat` subcommand's options: an optional prompt, then the model's."""
    chat = sub.add_parser(
        "chat", help="chat with an instruct model (its chat template), answers streamed",
        description="With PROMPT: one streamed answer and a stats line. Without: a multi-turn "
        "session reading lines from stdin; /reset clears the history, /stats shows acceptance "
        "and speed so far, /exit or end of input ends it.",
    )  # fmt: skip
    chat.add_argument("prompt", nargs="?", default=None,
                      help="one question (none: an interactive session)")  # fmt: skip
    add_model_options(chat, max_tokens=256)


def run_chat(args: argparse.Namespace) -> int:
    """Answer PROMPT, or hold a session over stdin until /exit or end of input."""
    params = sampling_params(args)
    llm = load_llm(args)
    require_chat_template(llm.tokenizer, llm.model_name)
    has_drafter = llm.engine.config.speculative is not None
    session = ChatSession(llm, params, has_drafter, sys.stdout, sys.stderr)
    if args.prompt is not None:
        out = session.ask(args.prompt)
        print(f"[{session.turn_line(out)}]", file=sys.stderr)
        return 0
    if isinstance(sys.stdin, io.TextIOWrapper):  # bytes that are not UTF-8: an error, not a crash
        sys.stdin.reconfigure(errors="surrogateescape")
    print(f"[chat with {llm.model_name}: {COMMANDS}]", file=sys.stderr, flush=True)
    for line in read_lines(sys.stdin):
        if not session.handle(line):
            break
    return 0


def read_lines(stdin: TextIO) -> Iterator[str]:
    """The user's lines: with a "> " prompt on a terminal, as they come from a pipe."""
    if not stdin.isatty():
        yield from stdin
        return
    while True:
        try:
            yield input("> ")
        except EOFError:
            print()
            return


@dataclass(slots=True)
class SessionStats:
    """Output tokens, generation time and acceptance counters summed over a session's answers."""

    answers: int = 0
    tokens: int = 0
    seconds: float = 0.0
    spec: SpecStats = field(default_factory=SpecStats)

    def add(self, out: RequestOutput) -> None:
        self.answers += 1
        self.tokens += len(out.token_ids)
        self.seconds += out.metrics.e2e_s or 0.0
        self.spec.merge(out.metrics.spec)


@dataclass(slots=True)
class ChatSession:
    """A conversation with the model: lines in, streamed answers out, the history kept."""

    llm: LLM
    params: SamplingParams
    has_drafter: bool
    """Whether the engine drafts (then each answer's line tells its acceptance)."""
    out: TextIO
    err: TextIO
    history: list[dict[str, str]] = field(default_factory=list)
    stats: SessionStats = field(default_factory=SessionStats)

    def handle(self, line: str) -> bool:
        """Act on one input line (a message or a command); False once the session should end."""
        text = line.strip()
        if not text:
            return True
        if text == "/exit":
            return False
        if text == "/reset":
            self.history.clear()
            print("[history cleared]", file=self.err, flush=True)
        elif text == "/stats":
            print(f"[{self.session_line()}]", file=self.err, flush=True)
        elif text.startswith("/"):
            self._error(f"unknown command {text}; {COMMANDS}")
        else:
            try:
                check_argument_text(text, "the line")
                self.ask(text)
            except ValueError as e:
                self._error(str(e))
        return True

    def ask(self, text: str) -> RequestOutput:
        """Stream the answer to `text` given the history; keep both in the history."""
        message = {"role": "user", "content": text}
        out = None
        with self.llm.chat_stream([*self.history, message], self.params) as stream:
            for delta in stream:
                self.out.write(delta.text)
                self.out.flush()
                out = delta.output or out
        assert out is not None  # a stream's last delta carries its output
        self.out.write("\n")
        self.out.flush()
        if out.finish_reason == "length":
            print(f"[answer cut at {self.params.max_tokens} tokens: --max-tokens]", file=self.err)
        self.history += [message, {"role": "assistant", "content": out.text}]
        self.stats.add(out)
        return out

    def turn_line(self, out: RequestOutput) -> str:
        """'12 tokens, 40.1 tokens/s, TTFT 120 ms, accepted 60% of 20 drafts, 2.2 tokens/step'
        (tokens/s counts the time to the first token, which dominates a short answer)."""
        m = out.metrics
        line = f"{len(out.token_ids)} tokens, {m.tokens_per_s or 0.0:.1f} tokens/s"
        if m.ttft_s is not None:
            line += f", TTFT {1e3 * m.ttft_s:.0f} ms"
        return f"{line}, {acceptance_line(m.spec)}" if self.has_drafter else line

    def session_line(self) -> str:
        """The session so far: answers, tokens, tokens/s and, with a drafter, acceptance."""
        s = self.stats
        rate = s.tokens / s.seconds if s.seconds else 0.0
        answers = f"{s.answers} answer" + ("" if s.answers == 1 else "s")
        line = f"session: {answers}, {s.tokens} tokens, {rate:.1f} tokens/s"
        return f"{line}, {acceptance_line(s.spec)}" if self.has_drafter else line

    def _error(self, message: str) -> None:
        print(f"verispec: error: {message}", file=self.err, flush=True)
