"""verispec's cache directory: the one path helper every part shares (named models, converted
GGUF files, the built native kernel, measured kernel choices, benchmark checkpoints), and the
small JSON files of measurements kept there."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    """$VERISPEC_CACHE, else $XDG_CACHE_HOME/verispec, else ~/.cache/verispec."""
    if os.environ.get("VERISPEC_CACHE"):
        return Path(os.environ["VERISPEC_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "verispec"


def read_cache_json(path: Path) -> dict[str, Any]:
    """A cached JSON object of measurements; {} when it is missing, unreadable or not one."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def write_cache_json(path: Path, value: dict[str, Any]) -> None:
    """Replace path with value atomically (concurrent readers see the old file or the new one);
    an unwritable cache only means measuring again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(value, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass
