"""The training corpus: the Python standard library of the running interpreter.

Files are read in sorted order (deterministic for one interpreter version); a fixed list of whole
modules is held out for evaluation and benchmarks and never seen in training.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Whole top-level modules held out of training (and their Lib/test/test_<name>.py files).
HELDOUT_MODULES: tuple[str, ...] = (
    "bisect", "calendar", "csv", "difflib", "fnmatch", "fractions", "glob", "graphlib",
    "heapq", "ipaddress", "netrc", "pprint", "queue", "sched", "secrets", "shlex",
    "statistics", "string", "textwrap", "uuid",
)  # fmt: skip

MAX_FILE_BYTES = 300_000  # larger files are mostly data tables, not code
_SKIPPED_DIRS = {"site-packages", "__pycache__"}


def stdlib_root() -> Path:
    """The directory holding the running interpreter's standard library sources."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(rel: Path) -> bool:
    """True for a held-out module's source or its test file (`rel` relative to the stdlib root)."""
    if len(rel.parts) == 1:
        return rel.stem in HELDOUT_MODULES
    is_test = rel.parts[0] == "test" and rel.stem.startswith("test_")
    return is_test and rel.stem.removeprefix("test_") in HELDOUT_MODULES


def corpus_files(split: str, root: Path | None = None) -> list[Path]:
    """Sorted .py files of one split ("train" or "heldout") under the stdlib root."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    root = root or stdlib_root()
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _SKIPPED_DIRS.intersection(rel.parts) or path.stat().st_size > MAX_FILE_BYTES:
            continue
        if is_heldout(rel) == (split == "heldout"):
            files.append(path)
    if split == "heldout":  # test files of held-out modules are excluded from both splits
        files = [p for p in files if len(p.relative_to(root).parts) == 1]
    return files


def read_texts(files: list[Path]) -> Iterator[str]:
    """File contents as text; files that are not valid UTF-8 (a few test fixtures) are skipped."""
    for path in files:
        try:
            yield path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue


@dataclass
class TokenStream:
    """All documents of a split as one token stream: <s> doc </s> <s> doc </s> ..."""

    tokens: torch.Tensor  # [num_tokens] int32
    num_documents: int


def tokenize_files(tokenizer: PreTrainedTokenizerBase, files: list[Path]) -> TokenStream:
    """Encode every file with BOS prepended and EOS appended, concatenated in file order."""
    texts = list(read_texts(files))
    ids: list[int] = []
    for enc in tokenizer(texts, add_special_tokens=True)["input_ids"]:
        ids.extend(enc)
        ids.append(tokenizer.eos_token_id)
    return TokenStream(torch.tensor(ids, dtype=torch.int32), len(texts))
