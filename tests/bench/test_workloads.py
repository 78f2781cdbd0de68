"""Workload prompts from held-out modules."""

from __future__ import annotations

from pathlib import Path

from verispec.bench.workloads import code_completion_prompts, spread
from verispec.train.corpus import corpus_files

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
        prompts[0].text
        == 'def documented(a, b):\n    """Add a and b.\n\n    Longer text.\n    """\n'
    )
    assert prompts[1].text == '    def other(self, y):\n        "One line."\n'


def test_heldout_modules_give_hundreds_of_prompts() -> None:
    prompts = code_completion_prompts(corpus_files("heldout"))
    assert len(prompts) > 100 and len({p.id for p in prompts}) == len(prompts)
    assert all(p.text.lstrip().startswith(("def ", "async def ")) for p in prompts)


def test_spread() -> None:
    assert spread(list(range(10)), 3) == [0, 3, 6]
    assert spread([1, 2], 5) == [1, 2]
    assert spread([], 2) == []
