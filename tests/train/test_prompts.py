"""Prompts built from source files (code, edit, free)."""

from __future__ import annotations

from pathlib import Path

from verispec.data.corpus import corpus_files
from verispec.train.prompts import code_completion_prompts, edit_prompts, free_prompts, spread

SOURCE = '''import os


def documented(a, b):
    """Add a and b.

    Longer text.
    """
    return a + b


def bare(x):
    return x


class K:
    async def method(self):
        """Only a docstring."""

    def other(self, y):
        "One line."
        z = y * 2
        return z
'''


def test_prompts_end_after_the_docstring(tmp_path: Path) -> None:
    path = tmp_path / "mod.py"
    path.write_text(SOURCE)
    prompts = code_completion_prompts([path])
    assert [p.id for p in prompts] == ["mod.documented:4", "mod.other:20"]
    assert (
        prompts[0].text == 'def documented(a, b):\n    """Add a and b.\n\n    Longer text.\n    """'
    )
    assert prompts[1].text == '    def other(self, y):\n        "One line."'


def test_heldout_modules_give_hundreds_of_prompts() -> None:
    prompts = code_completion_prompts(corpus_files("heldout"))
    assert len(prompts) > 100 and len({p.id for p in prompts}) == len(prompts)
    assert not any(p.text.endswith("\n") for p in prompts)  # see the module docstring
    assert all(p.text.lstrip().startswith(("def ", "async def ")) for p in prompts)


def test_spread() -> None:
    assert spread(list(range(10)), 3) == [0, 3, 6]
    assert spread([1, 2], 5) == [1, 2]
    assert spread([], 2) == []


def test_edit_prompts_ask_for_the_function_again_renamed(tmp_path: Path) -> None:
    path = tmp_path / "mod.py"
    path.write_text(SOURCE)
    prompts = edit_prompts([path])
    assert [p.id for p in prompts] == ["mod.documented:4", "mod.other:20"]
    other = prompts[1].text
    assert other.startswith('# Original version:\ndef other(self, y):\n    "One line."\n')
    assert other.endswith("renamed to other_v2, otherwise unchanged:\ndef other_v2(self, y):")


def test_free_prompts_start_at_the_module_and_each_top_level_definition(tmp_path: Path) -> None:
    path = tmp_path / "mod.py"
    path.write_text(SOURCE)
    prompts = free_prompts([path], lines_per_prompt=2)
    assert [p.id for p in prompts] == ["mod:1", "mod:4", "mod:12", "mod:16"]
    assert prompts[2].text == "def bare(x):\n    return x"
