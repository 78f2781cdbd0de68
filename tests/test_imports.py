"""Imports run downward: no module of the package imports (even lazily, inside a function) one
that imports it back, and each subpackage imports first, alone, in a fresh interpreter."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import verispec

ROOT = Path(verispec.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_modules(name: str) -> set[str]:
    """The package's modules that `name` imports anywhere, lazily inside functions included;
    `if TYPE_CHECKING:` blocks are left out (they never run)."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1],
                                 *([base] if base else [])])  # fmt: skip
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in MODULES else base)
        stack.extend(ast.iter_child_nodes(node))
    return {m for m in found if m in MODULES and m != name}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a list of nodes (first repeated at the end), or None.

    Worked example: {"a": {"b"}, "b": {"c"}, "c": {"a"}} -> ["a", "b", "c", "a"];
    {"a": {"b"}, "b": set()} -> None.
    """
    state: dict[str, int] = {}  # 1 = on the current path, 2 = finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_one_and_only_when_there_is_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_package_has_no_import_cycle() -> None:
    graph = {name: imported_modules(name) for name in MODULES}
    assert graph["verispec.engine.engine"] >= {
        "verispec.drafters.registry", "verispec.engine.request"
    }  # fmt: skip
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


MODEL_LAYERS = {
    "paths": ("verispec.paths",),
    "basics": ("verispec.models.batch", "verispec.models.config", "verispec.models.rope",
               "verispec.models.attention", "verispec.models.head_files"),
    "kernels": ("verispec.models.kernels",),
    "catalog": ("verispec.models.catalog",),
    "readers": ("verispec.models.weights.gguf", "verispec.models.weights.gguf_blocks",
                "verispec.models.weights.gguf_cache", "verispec.models.weights.gguf_config"),
    "model": ("verispec.models.llama", "verispec.models.eagle", "verispec.models.medusa",
              "verispec.models.paged"),
    "loader": ("verispec.models.weights.loader",),
}  # fmt: skip
"""The sub-layers of `models` (docs/design.md, section 2), each a list of modules or packages."""
MAY_IMPORT = {
    "paths": set(),
    "basics": set(),
    "kernels": {"paths", "basics"},
    "catalog": {"paths"},
    "readers": {"paths", "basics", "kernels"},
    "model": {"basics", "kernels"},
    "loader": {"paths", "basics", "kernels", "catalog", "readers", "model"},
}
"""The layers each layer's modules may import besides their own."""
OUTSIDE_MODELS = ("verispec.kv", "verispec.paths")
"""All that `models` imports of the rest of verispec."""


def model_layer(module: str) -> str | None:
    """The MODEL_LAYERS layer module belongs to, or None."""
    for layer, members in MODEL_LAYERS.items():
        if any(module == m or module.startswith(m + ".") for m in members):
            return layer
    return None


def test_the_models_sub_layers_import_only_downward() -> None:
    problems = []
    for name, path in MODULES.items():
        if not name.startswith("verispec.models") and name != "verispec.paths":
            continue
        imports = imported_modules(name)
        layer = model_layer(name)
        if layer is None:
            if path.name == "__init__.py" and not imports:
                continue  # a package's docstring: nothing to place
            problems.append(f"{name} is in no layer of MODEL_LAYERS")
            continue
        for imported in sorted(imports):
            if imported.startswith("verispec.models") or imported == "verispec.paths":
                other = model_layer(imported)
                if other != layer and other not in MAY_IMPORT[layer]:
                    problems.append(f"{name} ({layer}) imports {imported} ({other})")
            elif not imported.startswith(OUTSIDE_MODELS):
                problems.append(f"{name} imports {imported}, outside {OUTSIDE_MODELS}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "module",
    ["verispec.drafters", "verispec.drafters.registry", "verispec.engine.request",
     "verispec.config", "verispec.engine", "verispec.api.llm", "verispec.cli.main",
     "verispec.audit.fit", "verispec.train.recipe", "verispec.bench.workloads", "verispec.paths",
     "verispec.models.kernels.linear", "verispec.models.weights.loader",
     "verispec.models.catalog.hub"],
)  # fmt: skip
def test_each_part_imports_first_in_a_fresh_interpreter(module: str) -> None:
    done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
