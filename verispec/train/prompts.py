"""Prompts built from source files (the held-out standard-library modules, never seen in
training): the code, edit and free prompt kinds the benchmark ships and the recipe evaluates on.

Prompts end without a trailing newline: the byte-level BPE merges a newline with the
indentation after it into one token, so a prompt ending in a bare newline token would put the
model where training text never is (it would then rarely indent).
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Callable
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
        source = _source(path)
        lines = source.splitlines(keepends=True)
        for node in _documented_functions(source):
            text = "".join(lines[node.lineno - 1 : node.body[0].end_lineno]).rstrip("\n")
            prompts.append(Prompt(f"{path.stem}.{node.name}:{node.lineno}", text))
    return prompts


def _source(path: Path) -> str:
    """A file's text; empty for one that is not valid UTF-8 (a few standard-library test
    fixtures are not), which then yields no prompts."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return ""


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _documented_functions(source: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Functions (and methods) with a docstring and more than the docstring, by line; none
    for a file Python cannot parse (the standard library has a few, e.g. with a BOM)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    nodes = [
        n for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        and ast.get_docstring(n) is not None and len(n.body) > 1
    ]  # fmt: skip
    return sorted(nodes, key=lambda n: n.lineno)


def spread(items: list[T], n: int) -> list[T]:
    """n items evenly spaced over the list (all when n >= len): spread(range(10), 3) = 0, 3, 6."""
    if n >= len(items):
        return list(items)
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]


def edit_prompts(files: list[Path]) -> list[Prompt]:
    """Each documented function shown whole, then asked for again under a new name.

    The prompt is the function, a comment asking for the same function renamed to NAME_v2,
    and the renamed def line; a code model then copies most of the body from the prompt, the
    home ground of prompt lookup. Methods are dedented to module level. Order as in
    code_completion_prompts.
    """
    prompts = []
    for path in files:
        source = _source(path)
        lines = source.splitlines(keepends=True)
        for node in _documented_functions(source):
            block = textwrap.dedent("".join(lines[node.lineno - 1 : node.end_lineno]))
            header = block.split("\n", 1)[0]
            if f"def {node.name}(" not in header:
                continue  # decorated or unusual layout: skip rather than guess
            renamed = header.replace(f"def {node.name}(", f"def {node.name}_v2(", 1)
            text = (
                f"# Original version:\n{block}\n\n"
                f"# The same function renamed to {node.name}_v2, otherwise unchanged:\n{renamed}"
            )
            prompts.append(Prompt(f"{path.stem}.{node.name}:{node.lineno}", text))
    return prompts


def free_prompts(files: list[Path], lines_per_prompt: int = 12) -> list[Prompt]:
    """Open continuation: the first lines of each top-level class or function (and the module's
    first lines), to be continued freely (sampled at temperature 1.0 in the benchmark)."""
    prompts = []
    for path in files:
        source = _source(path)
        lines = source.splitlines(keepends=True)
        starts = [1] + [n.lineno for n in ast.parse(source).body if isinstance(n, _DEFS)]
        for start in starts:
            text = "".join(lines[start - 1 : start - 1 + lines_per_prompt]).rstrip("\n")
            if text.strip():
                prompts.append(Prompt(f"{path.stem}:{start}", text))
    return prompts


BUILDERS: dict[str, Callable[[list[Path]], list[Prompt]]] = {
    "code": code_completion_prompts, "edit": edit_prompts, "free": free_prompts,
}  # fmt: skip
MAX_PROMPT_CHARS = 1500  # keeps prompt + output well inside the embedded models' 1024 tokens


def build_prompts(
    kind: str, files: list[Path], num_prompts: int, fits: Callable[[str], bool] | None = None
) -> list[Prompt]:
    """Prompts of one kind built from source files: those of at most MAX_PROMPT_CHARS
    characters (and passing `fits`), spread to num_prompts."""
    candidates = [
        p for p in BUILDERS[kind](files)
        if len(p.text) <= MAX_PROMPT_CHARS and (fits is None or fits(p.text))
    ]  # fmt: skip
    return spread(candidates, num_prompts)
