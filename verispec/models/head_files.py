"""Drafter head directories (EAGLE, Medusa): config.json plus safetensors, read and written
with every tensor's shape checked against the config."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file


def read_head_dir(
    path: Path,
    what: str,
    shapes_of: Callable[[dict[str, Any]], tuple[Any, dict[str, tuple[int, ...]]]],
    defaults: Callable[[Any], dict[str, torch.Tensor]] | None = None,
) -> tuple[Any, dict[str, torch.Tensor]]:
    """(config, weights) of a head directory. shapes_of(config dict) -> (parsed config,
    {tensor name: shape}); defaults(parsed config) fills optional tensors; ValueError naming
    `what` for a missing config.json, a missing tensor or a shape the config does not imply."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{what} directory {path} has no config.json")
    try:
        raw = json.loads(config_file.read_text())
    except ValueError as e:
        raise ValueError(f"{what} config {config_file} is not valid JSON ({e})") from e
    config, shapes = shapes_of(raw)
    weights: dict[str, torch.Tensor] = defaults(config) if defaults is not None else {}
    for file in sorted(path.glob("*.safetensors")):
        weights.update(load_file(str(file)))
    for name, shape in shapes.items():
        if name not in weights:
            raise ValueError(f"{what} {path} lacks tensor {name!r}")
        if tuple(weights[name].shape) != shape:
            raise ValueError(
                f"{what} {path}: tensor {name!r} has shape {list(weights[name].shape)}, the "
                f"config implies {list(shape)}"
            )
    return config, weights


def write_head_dir(
    config: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    shapes: dict[str, tuple[int, ...]],
    path: Path,
    dtype: torch.dtype = torch.float16,
) -> None:
    """Write config.json and model.safetensors (floating tensors in dtype, others as int64)."""
    if set(tensors) != set(shapes):
        raise ValueError(f"head tensors must be exactly {sorted(shapes)}, got {sorted(tensors)}")
    path.mkdir(parents=True, exist_ok=True)
    out = {
        name: (t.detach().to(dtype) if t.is_floating_point() else t.detach().long()).contiguous()
        for name, t in tensors.items()
    }
    save_file(out, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
