"""verispec's cache directory: the one path helper every part shares (named models, converted
GGUF files, the built native kernel, measured kernel choices, benchmark checkpoints)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$VERISPEC_CACHE, else $XDG_CACHE_HOME/verispec, else ~/.cache/verispec."""
    if os.environ.get("VERISPEC_CACHE"):
        return Path(os.environ["VERISPEC_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "verispec"
