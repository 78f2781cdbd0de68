"""The repository's layout rules (docs/design.md, sections 2 and 7), checked: modules stay under
400 lines, at most three modules sit beside `__init__.py` at the top, test directories mirror
the package's (or benchmarks/'s), and benchmark scripts never import the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

import verispec

PACKAGE = Path(verispec.__file__).resolve().parent
REPO = PACKAGE.parent
MAX_LINES = 400
OWN_TEST_DIRS = ("helpers", "benchmarks")
"""Test directories that mirror no package directory: shared helpers, and benchmarks/'s own
helpers (tests/benchmarks/lib mirrors benchmarks/lib)."""


def oversized(root: Path, limit: int = MAX_LINES) -> list[str]:
    """The Python modules under root longer than limit lines, with their lengths."""
    return [f"{p.relative_to(root)}: {n} lines" for p in sorted(root.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > limit]  # fmt: skip


def cli_imports(script: Path) -> list[str]:
    """The verispec.cli modules a script imports (at any depth of its code)."""
    names = []
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return [n for n in names if n == "verispec.cli" or n.startswith("verispec.cli.")]


def test_no_module_is_over_400_lines() -> None:
    assert oversized(PACKAGE) == []


def test_the_size_check_sees_a_long_module(tmp_path: Path) -> None:
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "short.py").write_text("x = 1\n")
    assert oversized(tmp_path) == [f"long.py: {MAX_LINES + 1} lines"]


def test_at_most_three_modules_beside_the_init() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 3, top


def test_test_directories_mirror_the_package() -> None:
    tests = REPO / "tests"
    strays = []
    for directory in sorted(p for p in tests.rglob("*") if p.is_dir()):
        parts = directory.relative_to(tests).parts
        if "__pycache__" in parts or parts[0] in OWN_TEST_DIRS:
            continue
        if not (PACKAGE / directory.relative_to(tests)).is_dir():
            strays.append(str(directory.relative_to(REPO)))
    assert strays == []
    assert (REPO / "benchmarks" / "lib").is_dir()  # what tests/benchmarks/lib mirrors


def test_benchmark_scripts_never_import_the_cli(tmp_path: Path) -> None:
    """Scripts measure the package's parts and may import any module of it, but not the
    command line (what they share lives in verispec.bench or benchmarks/lib)."""
    scripts = sorted((REPO / "benchmarks").rglob("*.py"))
    assert scripts
    assert {s.name: cli_imports(s) for s in scripts if cli_imports(s)} == {}
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from verispec.cli.bench import run_facts\n")
    assert cli_imports(planted) == ["verispec.cli.bench"]
