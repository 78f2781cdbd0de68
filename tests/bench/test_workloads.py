"""The benchmark's shipped workload files."""

from __future__ import annotations

import platform

import pytest

from verispec.bench.workloads import BUILT_WITH_PYTHON, WORKLOADS, build_workload
from verispec.train.corpus import corpus_files
from verispec.train.prompts import MAX_PROMPT_CHARS


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_shipped_prompt_files(name: str) -> None:
    workload = WORKLOADS[name]
    prompts = workload.prompts()
    assert len(prompts) == workload.num_prompts and len(workload.prompts(4)) == 4
    assert all(len(p.text) <= MAX_PROMPT_CHARS for p in prompts)
    if platform.python_version() == BUILT_WITH_PYTHON:  # same stdlib: the files rebuild exactly
        assert build_workload(workload, corpus_files("heldout")) == prompts
