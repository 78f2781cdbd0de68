"""The embedded models: a small Python-code Llama and its distilled draft (named
`embedded-code` and `embedded-code-draft` in verispec/models/catalog/hub.py).

Both were trained by `verispec train all` on the Python standard library (see
`verispec/models/embedded/MODEL_CARD.md`) and ship inside the package as fp16 safetensors, so
they work with no download at all (the offline tests and the code benchmarks use them).
Loading upcasts them to the runtime's dtype (float32 on CPU).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EMBEDDED_DIR = Path(__file__).resolve().parent.parent / "embedded"
"""verispec/models/embedded/: the pair's files stay beside the model code, not in catalog/."""
EMBEDDED_MODELS = ("target", "draft")


def embedded_model_path(which: str = "target") -> Path:
    """Directory of the embedded target or draft checkpoint (Hugging Face format)."""
    if which not in EMBEDDED_MODELS:
        raise ValueError(
            f"embedded model must be one of {', '.join(EMBEDDED_MODELS)}; got {which!r}"
        )
    path = EMBEDDED_DIR / which
    if not (path / "config.json").is_file():
        raise ValueError(
            f"the embedded {which} model is missing from {path}; reinstall verispec, or rebuild it "
            "with `verispec train all --out RUN` and copy RUN/export/{target,draft} there"
        )
    return path


HEADS_DIR = EMBEDDED_DIR / "heads"
"""Drafter heads trained by verispec for its named models (`verispec train eagle`)."""


def shipped_head(name: str) -> tuple[Path, dict[str, Any]] | None:
    """A shipped head's directory and the speculative settings it was tuned with (config.json
    "verispec_speculative": SpecConfig fields, e.g. tree_topk); None when it is not shipped."""
    path = HEADS_DIR / name
    if not (path / "config.json").is_file():
        return None
    settings = json.loads((path / "config.json").read_text()).get("verispec_speculative", {})
    return path, dict(settings)
