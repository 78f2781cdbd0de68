"""One name per thing: no two classes in verispec/ share a name (private ones included), so a
name found in a traceback, a doc or a review points at one class."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import verispec

ROOT = Path(verispec.__file__).resolve().parent


def class_homes(root: Path) -> dict[str, list[str]]:
    """Each class name defined anywhere under root (nested classes too) -> the files that do."""
    homes: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                homes[node.name].append(str(path.relative_to(root.parent)))
    return homes


def shared_names(root: Path) -> dict[str, list[str]]:
    """The class names defined more than once under root, with where."""
    return {name: files for name, files in class_homes(root).items() if len(files) > 1}


def test_no_two_classes_share_a_name() -> None:
    assert shared_names(ROOT) == {}


def test_a_shared_name_is_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("class Engine:\n    pass\n", encoding="utf-8")
    (package / "sub" / "b.py").write_text("class Engine:\n    pass\nclass Other:\n    pass\n",
                                          encoding="utf-8")  # fmt: skip
    assert shared_names(package) == {"Engine": ["pkg/a.py", "pkg/sub/b.py"]}
