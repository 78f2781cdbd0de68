"""The benchmark's named workloads: prompt files shipped in verispec/bench/prompts/. The code
workloads are built from the held-out standard-library modules by verispec.train.prompts; the
chat workload is a hand-written set of instructions for chat models, and the agentic one a
hand-written set of agent turns (a support agent and a travel agent calling tools in JSON, a SQL
assistant, a code reviewer; eight conversations each, later ones quoting earlier tool calls),
where later requests' outputs repeat the structure of earlier ones (suffix decoding's home).
For code chat models, code_chat holds code-writing instructions (Python, JavaScript, TypeScript,
Rust, Go, SQL) that share none with the training instructions (verispec.train.instructions),
and code_edit gives a whole function with one small change to make, so the answer mostly
copies the prompt (prompt lookup's home)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verispec.data.corpus import corpus_files
from verispec.train.prompts import Prompt, build_prompts, spread
from verispec.types.chat import chat_prompt, check_conversation


@dataclass(frozen=True)
class ChatPrompt:
    """One chat prompt: the conversation so far, which the model continues as the assistant."""

    id: str
    messages: tuple[dict[str, str], ...]  # {"role": one of chat.ROLES, "content": text}


BenchPrompt = Prompt | ChatPrompt


@dataclass(frozen=True)
class Workload:
    """A named prompt set shipped in verispec/bench/prompts/NAME.jsonl."""

    name: str
    description: str
    max_tokens: int
    num_prompts: int  # prompts in the shipped file
    chat: bool = False  # rows hold "messages" (written by hand), not "prompt" (built from code)

    @property
    def path(self) -> Path:
        return PROMPTS_DIR / f"{self.name}.jsonl"

    def rows(self) -> list[dict[str, Any]]:
        """The shipped file's rows as written (an OpenAI chat request's fields, for `agent`)."""
        if not self.path.is_file():
            raise ValueError(f"workload file {self.path} is missing; reinstall verispec")
        with self.path.open(encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    def prompts(self, n: int | None = None) -> list[BenchPrompt]:
        """The shipped prompts (n of them, spread over the file; all when n is None)."""
        if not self.path.is_file():
            raise ValueError(f"workload file {self.path} is missing; reinstall verispec")
        with self.path.open(encoding="utf-8") as f:
            prompts = [parse_row(json.loads(line)) for line in f if line.strip()]
        return prompts if n is None else spread(prompts, n)


def parse_row(row: dict[str, Any]) -> BenchPrompt:
    """A prompt file's row: {"id", "prompt": text} or {"id", "messages": [{"role", "content"}]}.
    E.g. {"id": "a", "messages": [{"role": "user", "content": "Hi"}]} -> a ChatPrompt."""
    if "messages" not in row:
        return Prompt(row["id"], row["prompt"])
    try:
        messages = tuple(check_conversation(row["messages"]))
    except ValueError as e:
        raise ValueError(f"prompt {row['id']!r}: {e}") from None
    return ChatPrompt(row["id"], messages)


def prompt_token_ids(tokenizer: Any, prompt: BenchPrompt) -> list[int]:
    """A prompt's token ids: text as the tokenizer encodes it (with BOS when it adds one); a
    chat rendered by the model's chat template, which writes its own special tokens."""
    if isinstance(prompt, Prompt):
        return tokenizer(prompt.text).input_ids
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the chat workload needs a chat model: this model's tokenizer has no chat template "
            "(use the code, edit or free workloads for a base model)"
        )
    return chat_prompt(tokenizer, prompt.messages, "the bench target")[1]


PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
BUILT_WITH_PYTHON = "3.11.7"  # whose standard library the built prompt files come from
WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("code", "complete a function from its signature and docstring", 128, 32),
        Workload("edit", "repeat a function under a new name (mostly copied)", 192, 16),
        Workload("free", "open continuation of a module or definition", 128, 16),
        Workload("chat", "answer an instruction (explain, write code, rewrite)", 96, 37, True),
        Workload("agentic", "an agent's next turn (tool calls, SQL, code fixes)", 128, 32, True),
        Workload("code_chat", "write code for an instruction not in the training set", 256, 16,
                 True),
        Workload("code_edit", "rewrite a given function with one small change (mostly copied)",
                 384, 15, True),
    )
}

AGENT = Workload("agent", "JSON-schema extraction and forced tool calls, as chat requests", 256,
                 14, True)
"""Agents' requests (written for the bench, none from the tests): each row an OpenAI chat
request's messages with a json_schema response_format or tools and a named tool_choice. Its
answers are constrained, which the harness's engines do not do, so it is not in WORKLOADS:
benchmarks/agent_bench.py sends it to a real server."""


def build_workload(
    workload: Workload,
    files: list[Path],
    num_prompts: int | None = None,
    fits: Callable[[str], bool] | None = None,
) -> list[Prompt]:
    """A code workload's prompts built from source files (the held-out modules)."""
    if workload.chat:
        raise ValueError(f"workload {workload.name} is written by hand, not built from code")
    return build_prompts(workload.name, files, num_prompts or workload.num_prompts, fits)


def write_workload_files() -> None:
    """Rebuild every built prompt file from the running interpreter's held-out modules."""
    PROMPTS_DIR.mkdir(exist_ok=True)
    files = corpus_files("heldout")
    for workload in (w for w in WORKLOADS.values() if not w.chat):
        with workload.path.open("w", encoding="utf-8") as f:
            for p in build_workload(workload, files):
                f.write(json.dumps({"id": p.id, "prompt": p.text}) + "\n")


if __name__ == "__main__":  # python -m verispec.bench.workloads: rebuild the built prompt files
    write_workload_files()
