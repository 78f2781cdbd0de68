"""Imports run downward: every module sits on one layer of LAYERS and imports (even lazily,
inside a function, or only for type checking) only its own layer and those below; no module
imports one that imports it back; and each subpackage imports first, alone, in a fresh
interpreter."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import verispec

ROOT = Path(verispec.__file__).resolve().parent


def module_name(path: Path, root: Path = ROOT) -> str:
    """The dotted name of path, a file of the package in directory root."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules(root: Path) -> dict[str, Path]:
    """Every module of the package in directory root, by dotted name."""
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


MODULES = package_modules(ROOT)


def imported_modules(name: str, modules: dict[str, Path] = MODULES) -> set[str]:
    """The modules (of `modules`) that `name` imports anywhere: lazily inside functions and in
    `if TYPE_CHECKING:` blocks included (a loop through annotations is a loop all the same)."""
    tree = ast.parse(modules[name].read_text(encoding="utf-8"))
    package = name if modules[name].name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1],
                                 *([base] if base else [])])  # fmt: skip
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in modules else base)
        stack.extend(ast.iter_child_nodes(node))
    return {m for m in found if m in modules and m != name}


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module -> the modules it imports (imported_modules)."""
    return {name: imported_modules(name, modules) for name in modules}


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
    graph = import_graph(MODULES)
    assert graph["verispec.api.llm"] >= {
        "verispec.drafters.registry", "verispec.engine.engine"
    }  # fmt: skip
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_loop_through_type_checking_imports_is_found(tmp_path: Path) -> None:
    """The probe: a package whose only loop runs through `if TYPE_CHECKING:` blocks (both
    spellings, absolute and relative imports) fails the check the package passes."""
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "__init__.py").write_text("")
    (probe / "a.py").write_text("from probe.b import B\n\n\nclass A:\n    b: B\n")
    (probe / "b.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from probe.c import C\n\n\n"
        "class B:\n    c: C\n"
    )  # fmt: skip
    (probe / "c.py").write_text(
        "import typing\n\nif typing.TYPE_CHECKING:\n    from . import a\n\n\n"
        "class C:\n    a: a.A\n"
    )  # fmt: skip
    (probe / "d.py").write_text("from probe.a import A\n")  # imports into the loop, not part
    graph = import_graph(package_modules(probe))
    assert graph["probe.b"] == {"probe.c"} and graph["probe.c"] == {"probe.a"}
    assert find_cycle(graph) == ["probe.a", "probe.b", "probe.c", "probe.a"]
    (probe / "c.py").write_text("class C:\n    pass\n")  # the loop broken
    assert find_cycle(import_graph(package_modules(probe))) is None


LAYERS: tuple[tuple[str, ...], ...] = (
    ("verispec.types", "verispec.data", "verispec.paths"),
    ("verispec.config",),
    ("verispec.kv",),
    ("verispec.sample",),
    ("verispec.models",),
    ("verispec.tokenizer",),
    ("verispec.spec.cost", "verispec.spec.policy", "verispec.spec.profiles"),
    ("verispec.engine",),
    ("verispec.drafters",),
    ("verispec.spec.resolve",),
    ("verispec.api", "verispec"),
    ("verispec.train",),
    ("verispec.serve",),
    ("verispec.bench",),
    ("verispec.audit",),
    ("verispec.cli",),
)
"""The package's layers, lowest first (docs/design.md, section 2 shows this list): a module
imports only modules of its own layer and of the layers below. Each entry names a module, or a
package and everything under it; the most specific entry wins, and the root package `verispec`
(a name without a dot) names only its own `__init__.py`, the public API."""


def layer_of(module: str, layers: tuple[tuple[str, ...], ...] = LAYERS) -> int | None:
    """The index in layers of the most specific entry naming module, or None."""
    best: tuple[int, int] | None = None  # (entry length, layer index)
    for index, members in enumerate(layers):
        for m in members:
            under = "." in m and module.startswith(m + ".")  # a root package: itself alone
            if (module == m or under) and (best is None or len(m) > best[0]):
                best = (len(m), index)
    return None if best is None else best[1]


def layer(module: str) -> int:
    """layer_of module in LAYERS, which must place it."""
    found = layer_of(module)
    assert found is not None, f"{module} is on no layer"
    return found


def upward_imports(
    graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...] = LAYERS
) -> list[str]:
    """Every import of graph that runs up the layers, and every module on no layer (a package
    whose `__init__.py` imports nothing is left out: a docstring has no layer)."""
    problems = []
    for name in sorted(graph):
        layer = layer_of(name, layers)
        if layer is None:
            if graph[name]:
                problems.append(f"{name} is on no layer of LAYERS")
            continue
        for imported in sorted(graph[name]):
            other = layer_of(imported, layers)
            if other is not None and other > layer:
                problems.append(f"{name} (layer {layer + 1}) imports {imported} "
                                f"(layer {other + 1})")  # fmt: skip
    return problems


def layers_text(layers: tuple[tuple[str, ...], ...] = LAYERS) -> str:
    """The layers as docs/design.md section 2 shows them: one numbered line each."""
    return "\n".join(f"{i:>2}. {', '.join(m)}" for i, m in enumerate(layers, start=1))


def test_imports_run_down_the_layers() -> None:
    problems = upward_imports(import_graph(MODULES))
    assert not problems, "\n".join(problems)


def test_every_module_is_on_a_layer() -> None:
    unplaced = {name for name in MODULES if layer_of(name) is None}
    assert unplaced == {"verispec.spec"}  # a docstring over two layers' modules
    assert layer("verispec") == layer("verispec.api.llm")
    assert layer("verispec.spec.resolve") > layer("verispec.drafters.registry")
    assert layer("verispec.spec.cost") < layer("verispec.engine.engine")


def test_a_planted_upward_import_fails_the_check(tmp_path: Path) -> None:
    """The probe: a package of two layers passes, then fails once its low module imports the
    high one (lazily, inside a function); a fake graph with the engine importing a drafter
    fails too."""
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "__init__.py").write_text("")
    (probe / "low.py").write_text("X = 1\n")
    (probe / "high.py").write_text("from probe.low import X\n\nY = X\n")
    layers = (("probe.low",), ("probe.high",))
    assert upward_imports(import_graph(package_modules(probe)), layers) == []
    (probe / "low.py").write_text("def f() -> int:\n    from probe import high\n\n"
                                  "    return high.Y\n")  # fmt: skip
    assert upward_imports(import_graph(package_modules(probe)), layers) == [
        "probe.low (layer 1) imports probe.high (layer 2)"
    ]
    graph = import_graph(MODULES)
    graph["verispec.engine.engine"] = graph["verispec.engine.engine"] | {
        "verispec.drafters.registry"
    }  # fmt: skip
    assert upward_imports(graph) == [
        f"verispec.engine.engine (layer {layer('verispec.engine') + 1}) imports "
        f"verispec.drafters.registry (layer {layer('verispec.drafters') + 1})"
    ]


def test_the_design_doc_shows_the_layers() -> None:
    design = (ROOT.parent / "docs" / "design.md").read_text(encoding="utf-8")
    assert layers_text() in design, "docs/design.md section 2 must show:\n" + layers_text()


MODEL_LAYERS = {
    "paths": ("verispec.paths",),
    "basics": ("verispec.models.batch", "verispec.models.config", "verispec.models.rope",
               "verispec.models.attention", "verispec.models.head_files"),
    "kernels": ("verispec.models.kernels",),
    "catalog": ("verispec.models.catalog",),
    "readers": ("verispec.models.weights.gguf", "verispec.models.weights.gguf_blocks",
                "verispec.models.weights.gguf_cache", "verispec.models.weights.gguf_config"),
    "model": ("verispec.models.llama", "verispec.models.eagle_config",
              "verispec.models.speculators", "verispec.models.eagle", "verispec.models.medusa",
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
OUTSIDE_MODELS = ("verispec.kv", "verispec.paths", "verispec.types.numerics")
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


FIRST_IMPORTS = [
    "verispec.types", "verispec.data.corpus", "verispec.engine.drafter",
    "verispec.drafters", "verispec.drafters.registry", "verispec.engine.request",
    "verispec.config", "verispec.engine", "verispec.api.llm", "verispec.cli.main",
    "verispec.spec.resolve", "verispec.spec.policy", "verispec.audit.fit", "verispec.train.recipe",
    "verispec.bench.workloads", "verispec.paths", "verispec.models.kernels.linear",
    "verispec.models.weights.loader", "verispec.models.catalog.hub",
]  # fmt: skip

INSIDE = ("verispec", "__future__")


def third_party_imports(modules: dict[str, Path] = MODULES) -> list[str]:
    """What the package's modules import from outside it at their top level: "a.b" for
    `import a.b`, "a.b:c" for `from a.b import c` (relative and verispec imports left out)."""
    found: dict[str, None] = {}  # in order, once each
    for path in modules.values():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [f"{node.module}:{alias.name}" for alias in node.names]
            else:
                continue
            outside = [n for n in names if n.split(".")[0].split(":")[0] not in INSIDE]
            found.update(dict.fromkeys(outside))
    return list(found)


FORK_EACH = """
import importlib, json, os, sys, traceback

for name in json.loads(sys.argv[1]):  # third-party only: no verispec module is loaded here
    module, _, attribute = name.partition(":")
    try:
        getattr(importlib.import_module(module), attribute or "__name__", None)
    except BaseException:
        pass  # the child that needs it imports it, and fails there if it must
for module in sys.argv[2:]:
    read, write = os.pipe()
    if os.fork() == 0:  # the child imports one module first, then exits
        os.close(read)
        try:
            importlib.import_module(module)
        except BaseException:
            os.write(write, traceback.format_exc().encode())
            os._exit(1)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        error = pipe.read().decode()
    status = os.waitstatus_to_exitcode(os.wait()[1])
    print(json.dumps([module, status, error]), flush=True)
"""


@pytest.fixture(scope="module")
def first_imports() -> dict[str, tuple[int, str]]:
    """module -> (exit status, traceback) of importing it first in a fresh interpreter. One
    interpreter runs the package's top-level third-party imports (torch, transformers, ...)
    and forks a child per module: each starts with no verispec module loaded, as a fresh
    interpreter does, without paying torch's import sixteen times (2-3 minutes on 2 busy
    cores)."""
    preload = json.dumps(third_party_imports())
    done = subprocess.run([sys.executable, "-c", FORK_EACH, preload, *FIRST_IMPORTS],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    results = {}
    for line in done.stdout.splitlines():
        module, status, error = json.loads(line)
        results[module] = (status, error)
    assert list(results) == FIRST_IMPORTS, done.stderr
    return results


@pytest.mark.parametrize("module", FIRST_IMPORTS)
def test_each_part_imports_first_in_a_fresh_interpreter(
    module: str, first_imports: dict[str, tuple[int, str]]
) -> None:
    status, error = first_imports[module]
    assert status == 0, error
