"""Prompts built from the held-out standard-library modules (never seen in training)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt and where it came from."""

    id: str  # "module.function:line"
    text: str


def code_completion_prompts(files: list[Path]) -> list[Prompt]:
    """Each documented function as a prompt: its def line(s) through the end of its docstring.

    E.g. for `def f(x):\\n    \"\"\"Double x.\"\"\"\\n    return 2 * x` the prompt is the first two
    lines and the model is asked to write the body. Functions whose body is only the docstring
    are skipped. Order: files in the given order, functions by line.
    """
    prompts = []
    for path in files:
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines(keepends=True)
        nodes = [
            n for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            and ast.get_docstring(n) is not None and len(n.body) > 1
        ]  # fmt: skip
        for node in sorted(nodes, key=lambda n: n.lineno):
            text = "".join(lines[node.lineno - 1 : node.body[0].end_lineno])
            prompts.append(Prompt(f"{path.stem}.{node.name}:{node.lineno}", text))
    return prompts


def spread(items: list[T], n: int) -> list[T]:
    """n items evenly spaced over the list (all when n >= len): spread(range(10), 3) = 0, 3, 6."""
    if n >= len(items):
        return list(items)
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]
