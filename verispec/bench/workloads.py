"""The benchmark's named workloads: prompt files shipped in verispec/bench/prompts/, built
from the held-out standard-library modules by verispec.train.prompts."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from verispec.train.corpus import corpus_files
from verispec.train.prompts import Prompt, build_prompts, spread


@dataclass(frozen=True)
class Workload:
    """A named prompt set shipped in verispec/bench/prompts/NAME.jsonl."""

    name: str
    description: str
    max_tokens: int
    num_prompts: int  # prompts in the shipped file

    @property
    def path(self) -> Path:
        return PROMPTS_DIR / f"{self.name}.jsonl"

    def prompts(self, n: int | None = None) -> list[Prompt]:
        """The shipped prompts (n of them, spread over the file; all when n is None)."""
        if not self.path.is_file():
            raise ValueError(f"workload file {self.path} is missing; reinstall verispec")
        with self.path.open(encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        prompts = [Prompt(r["id"], r["prompt"]) for r in rows]
        return prompts if n is None else spread(prompts, n)


PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
BUILT_WITH_PYTHON = "3.11.7"  # whose standard library the shipped prompt files come from
WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("code", "complete a function from its signature and docstring", 128, 32),
        Workload("edit", "repeat a function under a new name (mostly copied)", 192, 16),
        Workload("free", "open continuation of a module or definition", 128, 16),
    )
}


def build_workload(
    workload: Workload,
    files: list[Path],
    num_prompts: int | None = None,
    fits: Callable[[str], bool] | None = None,
) -> list[Prompt]:
    """A workload's prompts built from source files (the held-out modules)."""
    return build_prompts(workload.name, files, num_prompts or workload.num_prompts, fits)


def write_workload_files() -> None:
    """Rebuild every shipped prompt file from the running interpreter's held-out modules."""
    PROMPTS_DIR.mkdir(exist_ok=True)
    files = corpus_files("heldout")
    for workload in WORKLOADS.values():
        with workload.path.open("w", encoding="utf-8") as f:
            for p in build_workload(workload, files):
                f.write(json.dumps({"id": p.id, "prompt": p.text}) + "\n")


if __name__ == "__main__":  # python -m verispec.bench.workloads: rebuild the prompt files
    write_workload_files()
