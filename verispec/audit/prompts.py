"""The prompts `verispec verify` checks: a user's JSONL file, or a shipped workload's."""

from __future__ import annotations

import json
from pathlib import Path

from verispec.bench.workloads import WORKLOADS, BenchPrompt, ChatPrompt, parse_row


def read_prompts(path: str) -> list[BenchPrompt]:
    """The prompts of a --prompts file: one {"prompt": TEXT} or {"messages": [...]} a line, an
    "id" optional (default "line N"); checked before any model loads.

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
    ...     _ = f.write('{"prompt": "def f():"}\\n\\n{"id": "x", "prompt": "import os"}\\n')
    >>> [(p.id, p.text) for p in read_prompts(f.name)]
    [('line 1', 'def f():'), ('x', 'import os')]
    >>> Path(f.name).unlink()
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--prompts: cannot read {path}: {e}") from None
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or ("prompt" in row) == ("messages" in row):
                raise ValueError('expected an object with "prompt" (text) or "messages"')
            if "prompt" in row and (not isinstance(row["prompt"], str) or not row["prompt"]):
                raise ValueError('"prompt" must be non-empty text')
            prompts.append(parse_row({**row, "id": str(row.get("id", f"line {number}"))}))
        except ValueError as e:
            raise ValueError(f"--prompts {path} line {number}: {e}") from None
    if not prompts:
        raise ValueError(f"--prompts {path} holds no prompt")
    return prompts


def choose_prompts(
    path: str | None, given: list[BenchPrompt] | None, chat: bool, n: int | None
) -> tuple[list[BenchPrompt], str]:
    """The prompts to check and where they come from: the --prompts file's (its first n), or n
    of the shipped chat workload (for a model with a chat template) or code workload, spread
    over the file."""
    if path is None or given is None:
        workload = WORKLOADS["chat" if chat else "code"]
        return workload.prompts(n), f"the shipped {workload.name} workload"
    if not chat and any(isinstance(p, ChatPrompt) for p in given):
        raise ValueError(f"--prompts {path} holds chat messages, but the model has no chat "
                         'template; give {"prompt": TEXT} rows')  # fmt: skip
    return given[:n], path
